package capture

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// startCold builds mt.c, makes it cold, and runs it under the runtime.
func startCold(t *testing.T, env ...string) *testutil.Process {
	t.Helper()
	return startColdSpec(t, testutil.Spec{Sources: []string{"mt.c"}}, env)
}

// startColdSpec builds spec's program, coldpatches it and runs it with args
// under the gcc-built runtime, env added to the preload.
func startColdSpec(t *testing.T, spec testutil.Spec, env []string, args ...string) *testutil.Process {
	t.Helper()
	testutil.RequirePtrace(t)
	lib := testutil.Runtime(t, "gcc")
	fx := testutil.Build(t, spec)
	if r := testutil.Run(t, "coldpatch", fx.Path); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	return testutil.Start(t, append([]string{"LD_PRELOAD=" + lib}, env...), fx.Path, args...)
}

func run(t *testing.T, args ...string) testutil.Result {
	t.Helper()
	r := testutil.Run(t, "hotpatch", args...)
	if r.Code != 0 {
		t.Fatalf("hotpatch %s: exit %d: %s", strings.Join(args, " "), r.Code, r.Stderr)
	}
	return r
}

// allOff asserts the capture put every probe back off.
func allOff(t *testing.T, p *testutil.Process) {
	t.Helper()
	var states []struct{ State, Function string }
	json.Unmarshal([]byte(run(t, "list", "--pid", fmt.Sprint(p.Pid), "--json").Stdout), &states)
	if len(states) == 0 {
		t.Fatal("list found no probes")
	}
	for _, s := range states {
		if s.State != "off" {
			t.Errorf("%s left %s after the capture", s.Function, s.State)
		}
	}
}

// eps is half a nanosecond in the trace's microseconds: timestamps are whole
// nanoseconds, sums of them in float64 are not always exact.
const eps = 0.0005

// within reports whether slice a lies inside slice b.
func within(a, b slice) bool { return b.Ts <= a.Ts+eps && a.Ts+a.Dur <= b.Ts+b.Dur+eps }

type slice struct {
	Name string  `json:"name"`
	Ph   string  `json:"ph"`
	Ts   float64 `json:"ts"`
	Dur  float64 `json:"dur"`
	Tid  int     `json:"tid"`
}

func TestTrace(t *testing.T) {
	p := startCold(t)
	out := filepath.Join(t.TempDir(), "trace.json")
	r := run(t, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "work", "--enable", "leaf", "--duration", "120s", "--max-calls", "50000", "-o", out, "--json")
	var summary struct {
		Calls   int    `json:"calls"`
		Dropped uint64 `json:"dropped_events"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &summary); err != nil {
		t.Fatalf("summary: %v: %q", err, r.Stdout)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ TraceEvents []slice }
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("trace is not JSON: %v", err)
	}
	byTid := map[int][]slice{}
	n := 0
	for _, e := range doc.TraceEvents {
		if e.Ph == "X" {
			byTid[e.Tid] = append(byTid[e.Tid], e)
			n++
		}
	}
	if n == 0 || n != summary.Calls || n < 50000 {
		t.Fatalf("trace holds %d calls, summary says %d; want them equal and at least the limit", n, summary.Calls)
	}
	// mt.c's four threads call work and leaf as fast as they can: full rings
	// drop events (counted), and a leaf whose work entry was dropped has no
	// enclosing work. Nest-or-disjoint holds regardless.
	exact := summary.Dropped == 0
	for tid, ev := range byTid {
		var works []slice
		for _, e := range ev {
			if e.Name == "work" {
				works = append(works, e)
			}
		}
		for _, e := range ev {
			if e.Name != "leaf" {
				continue
			}
			// work calls leaf: every leaf lies inside a work of its thread,
			// unless the capture began or ended mid-call.
			inside := false
			for _, w := range works {
				if within(e, w) {
					inside = true
					break
				}
			}
			if exact && !inside && len(works) > 0 && e.Ts > works[0].Ts && e.Ts+e.Dur < works[len(works)-1].Ts {
				t.Fatalf("thread %d: leaf at %.3fµs is not inside any work", tid, e.Ts)
			}
		}
		// Slices of one thread nest or are disjoint.
		for i := range ev {
			for j := i + 1; j < len(ev) && j < i+50; j++ {
				a, b := ev[i], ev[j]
				overlap := a.Ts+eps < b.Ts+b.Dur && b.Ts+eps < a.Ts+a.Dur
				nested := within(b, a) || within(a, b)
				if overlap && !nested {
					t.Fatalf("thread %d: %s@%.3f+%.3f and %s@%.3f+%.3f overlap without nesting", tid, a.Name, a.Ts, a.Dur, b.Name, b.Ts, b.Dur)
				}
			}
		}
	}
	allOff(t, p)
	if out, _ := p.Finish(); !strings.Contains(out, "wrong=0") {
		t.Fatalf("program output %q", out)
	}
}

func TestProfile(t *testing.T) {
	p := startCold(t)
	out := filepath.Join(t.TempDir(), "mt.pprof")
	r := run(t, "profile", "--pid", fmt.Sprint(p.Pid), "--samples", "200", "--epoch", "20ms", "--duration", "400ms", "-o", out, "--json")
	var res struct {
		Functions []struct {
			Name    string `json:"name"`
			Entries uint64 `json:"entries"`
		} `json:"functions"`
		Epochs      int     `json:"epochs"`
		Toggles     uint64  `json:"toggles"`
		Hooks       uint64  `json:"hooks"`
		HitCostNs   float64 `json:"hit_cost_ns"`
		HitCostFrom string  `json:"hit_cost_from"`
		Slowdown    float64 `json:"estimated_slowdown"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
		t.Fatalf("%v: %q", err, r.Stdout)
	}
	if res.Epochs < 2 || res.Toggles == 0 {
		t.Errorf("%d epochs, %d toggles: the quota never cut in", res.Epochs, res.Toggles)
	}
	got := map[string]uint64{}
	for _, f := range res.Functions {
		got[f.Name] = f.Entries
	}
	if got["work"] < 200 || got["leaf"] < 200 {
		t.Errorf("work %d and leaf %d calls, want at least one epoch's quota each", got["work"], got["leaf"])
	}
	// the quota is enforced at the hook: never more than K per epoch
	for name, n := range got {
		if n > 200*uint64(res.Epochs) {
			t.Errorf("%s recorded %d calls in %d epochs of quota 200", name, n, res.Epochs)
		}
	}
	if res.HitCostNs <= 0 || !strings.HasPrefix(res.HitCostFrom, "measured in the target") || res.Hooks == 0 || res.Slowdown <= 0 {
		t.Errorf("hit cost %.1f ns (%s), %d hooks, slowdown %.4f: want a cost measured in the target", res.HitCostNs, res.HitCostFrom, res.Hooks, res.Slowdown)
	}
	top, err := exec.Command("go", "tool", "pprof", "-top", out).CombinedOutput()
	if err != nil || !strings.Contains(string(top), "work") || !strings.Contains(string(top), "leaf") {
		t.Fatalf("go tool pprof -top: %v\n%s", err, top)
	}
	allOff(t, p)
	if out, _ := p.Finish(); !strings.Contains(out, "wrong=0") {
		t.Fatalf("program output %q", out)
	}
}

// TestStatsInput: a short-lived program measured through EDGEPROBE_OUTPUT
// gives exact counts, named from its symbols (static functions too).
func TestStatsInput(t *testing.T) {
	lib := testutil.Runtime(t, "gcc")
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}, Opt: "-O0"})
	out := filepath.Join(t.TempDir(), "run.ep")
	cmd := exec.Command(fx.Path, "12")
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib, "EDGEPROBE_OUTPUT="+out)
	if b, err := testutil.CombinedOutputBound(cmd); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	r := testutil.Run(t, "hotpatch", "stats", "--input", out, "--json", "--sort", "name")
	if r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	var st struct {
		Functions []map[string]any `json:"functions"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatal(err)
	}
	// basic.c with n=12: fib is called 2*fib(13)-1 times; apply 12 times,
	// alternating add and mul; tail calls add once more; sq once per i.
	want := map[string]float64{"main": 1, "fib": 465, "apply": 12, "add": 7, "mul": 6, "tail": 1, "sum_squares": 1, "sq": 12}
	seen := map[string]bool{}
	for _, f := range st.Functions {
		for _, k := range []string{"name", "object", "entries", "exits", "total_ns", "p50_ns", "p99_ns", "max_ns"} {
			if _, ok := f[k]; !ok {
				t.Fatalf("row lacks %q: %v", k, f)
			}
		}
		name := f["name"].(string)
		if w, ok := want[name]; ok {
			seen[name] = true
			if f["entries"].(float64) != w || f["exits"].(float64) != w {
				t.Errorf("%s: %v entries, %v exits, want %v", name, f["entries"], f["exits"], w)
			}
		}
	}
	if len(seen) != len(want) {
		t.Errorf("functions seen %v, want all of %v", seen, want)
	}
}

// TestStaticRuntime: a static program carries the runtime itself
// (libedgeprobe.a, linked whole): coldpatch finds its sites (the runtime's
// hooks are distinct functions, unlike glibc's), hotpatch turns them on and
// off, and stats reads what they recorded.
func TestStaticRuntime(t *testing.T) {
	testutil.RequirePtrace(t)
	lib := testutil.RuntimeArchive(t, "gcc")
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"mt.c"}, Static: true, PIE: testutil.Bool(false),
		LDFlags: []string{"-Wl,--whole-archive", lib, "-Wl,--no-whole-archive"}})
	if r := testutil.Run(t, "coldpatch", fx.Path); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	p := testutil.Start(t, nil, fx.Path)
	progress := p.Symbol(fx.Path, "progress")
	pid := fmt.Sprint(p.Pid)
	calls := func() uint64 {
		var st struct {
			Functions []struct {
				Name    string `json:"name"`
				Entries uint64 `json:"entries"`
			} `json:"functions"`
		}
		if err := json.Unmarshal([]byte(run(t, "stats", "--pid", pid, "--json").Stdout), &st); err != nil {
			t.Fatal(err)
		}
		for _, f := range st.Functions {
			if f.Name == "work" {
				return f.Entries
			}
		}
		return 0
	}
	p.AwaitProgress(progress, 20000)
	if n := calls(); n != 0 {
		t.Fatalf("cold static program recorded %d calls of work", n)
	}
	run(t, "--pid", pid, "--enable", "work")
	p.AwaitProgress(progress, 20000)
	on := calls()
	if on == 0 {
		t.Fatal("work's probes are on but the runtime recorded no call")
	}
	run(t, "--pid", pid, "--disable", "work")
	p.AwaitProgress(progress, 2000) // calls in flight when the sites flipped finish
	a := calls()
	p.AwaitProgress(progress, 20000)
	if b := calls(); b != a {
		t.Fatalf("work recorded %d more calls after its probes went off", b-a)
	}
	if out, _ := p.Finish(); !strings.Contains(out, "wrong=0") {
		t.Fatalf("program output %q", out)
	}
}

// TestCapturesRestoreWhatTheyFound: trace and profile leave every probe in
// the state they found it, including probes that were on before (issue 11:
// profile turned them off, since its restore skipped the sites its first
// enable had not changed).
func TestCapturesRestoreWhatTheyFound(t *testing.T) {
	p := startCold(t)
	pid := fmt.Sprint(p.Pid)
	run(t, "--pid", pid, "--enable", "work")
	want := func(what string) {
		t.Helper()
		var states []struct{ State, Function, Kind string }
		json.Unmarshal([]byte(run(t, "list", "--pid", pid, "--json").Stdout), &states)
		if len(states) == 0 {
			t.Fatal("list found no probes")
		}
		for _, s := range states {
			if on := s.Function == "work"; (s.State == "on") != on || (s.State != "on" && s.State != "off") {
				t.Errorf("after %s: %s %s is %s, want %s", what, s.Kind, s.Function, s.State, map[bool]string{true: "on", false: "off"}[on])
			}
		}
	}
	want("hotpatch --enable work")
	// One epoch longer than the run: work reaches its quota and stays off
	// until the end, where only the restore can turn it back on.
	run(t, "profile", "--pid", pid, "--samples", "50", "--epoch", "1h", "--duration", "300ms", "-o", filepath.Join(t.TempDir(), "p.pprof"))
	want("profile")
	run(t, "trace", "--pid", pid, "--enable", "work", "--enable", "leaf", "--duration", "100ms", "-o", filepath.Join(t.TempDir(), "t.json"))
	want("trace")
	if out, _ := p.Finish(); !strings.Contains(out, "wrong=0") {
		t.Fatalf("program output %q", out)
	}
}
