package capture

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// Trace filters enforced by the runtime (D32): each test checks the
// events against counts that follow from the program and the filter.

// fibTreeMax is fibTree with the calls at depth max and deeper left out:
// what a trace with --max-depth max shows of fib(n).
func fibTreeMax(n, depth, max int, lines []string) []string {
	ind := strings.Repeat("  ", depth)
	if n < 2 || depth+1 >= max {
		return append(lines, ind+"fib();")
	}
	lines = append(lines, ind+"fib() {")
	lines = fibTreeMax(n-1, depth+1, max, lines)
	lines = fibTreeMax(n-2, depth+1, max, lines)
	return append(lines, ind+"} /* fib */")
}

// TestTraceMaxDepth: with --max-depth 2 every call tree of fib(5) shows
// exactly fib(5) and its two calls, never a deeper one, for both providers.
func TestTraceMaxDepth(t *testing.T) {
	testutil.RequirePtrace(t)
	const n, max = 5, 2
	want := map[string]int{}
	for k := 0; k <= n; k++ {
		want[strings.Join(fibTreeMax(k, 0, max, nil), "\n")] = k
	}
	for _, spec := range []testutil.Spec{
		{Sources: []string{"calltree.c"}, Opt: "-O0"},
		{Sources: []string{"calltree.c"}, Opt: "-O0", NoInstr: true, Profile: testutil.ProfileFentry},
	} {
		t.Run(spec.String(), func(t *testing.T) {
			p := startColdSpec(t, spec, []string{"EDGEPROBE_RING_EVENTS=65536"}, fmt.Sprint(n))
			r := run(t, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "fib", "--max-depth", strconv.Itoa(max),
				"--duration", "60s", "--max-calls", "300", "--format", "text", "--json")
			var sum struct {
				Dropped uint64 `json:"dropped_events"`
			}
			if err := json.Unmarshal([]byte(r.Stderr), &sum); err != nil || sum.Dropped != 0 {
				t.Fatalf("summary %q (%v): want no drops", r.Stderr, err)
			}
			full, trees := 0, 0
			var cur []string
			sc := bufio.NewScanner(strings.NewReader(r.Stdout))
			for sc.Scan() {
				line := sc.Text()
				if strings.HasPrefix(line, "#") {
					continue
				}
				_, fn, ok := strings.Cut(line, "] | ")
				if !ok {
					t.Fatalf("line %q", line)
				}
				if strings.Contains(fn, "still running") {
					break
				}
				if strings.HasPrefix(fn, strings.Repeat("  ", max)) {
					t.Fatalf("a call at depth %d or more: %q", max, line)
				}
				cur = append(cur, fn)
				if strings.HasPrefix(fn, " ") || (fn == "fib() {" && len(cur) == 1) {
					continue
				}
				k, ok := want[strings.Join(cur, "\n")]
				if !ok {
					t.Fatalf("tree %d is not fib's cut at depth %d:\n%s", trees, max, strings.Join(cur, "\n"))
				}
				trees++
				if k == n {
					full++
				}
				cur = cur[:0]
			}
			if full < 10 {
				t.Errorf("%d fib(%d) trees of %d", full, n, trees)
			}
			if o, _ := p.Finish(); !strings.HasPrefix(o, "done ") {
				t.Fatalf("program output %q", o)
			}
		})
	}
}

// workerTids are the threads of pid other than its main thread.
func workerTids(t *testing.T, pid int) []int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil && tid != pid {
			out = append(out, tid)
		}
	}
	if len(out) == 0 {
		t.Fatal("no worker threads")
	}
	return out
}

func chromeCalls(t *testing.T, path string) []slice {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ TraceEvents []slice }
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("trace is not JSON: %v", err)
	}
	var out []slice
	for _, e := range doc.TraceEvents {
		if e.Ph == "X" {
			out = append(out, e)
		}
	}
	return out
}

// TestTraceTid: with --tid naming one of mt.c's four workers, every call in
// the trace is that thread's, and the capture fills up all the same.
func TestTraceTid(t *testing.T) { traceTids(t, 1, 3000) }

// TestTraceTwoTids: with --tid naming two of mt.c's four workers, every call
// in the trace is one of theirs and both are in it (a second listed thread
// takes the hooks' list walk, edgeprobe_cyg.S FILTER_VERDICT; the unlisted
// two walk it to its end). 60,000 calls: a capture long enough that both listed
// threads run in it on a loaded machine (at 6,000 one scheduler slice of
// the first could fill it).
func TestTraceTwoTids(t *testing.T) { traceTids(t, 2, 60000) }

// TestTraceFilterVerdictRenewed: a thread keeps its verdict on a capture's
// filters (D58) only while the filters it was made from stand. With work and
// leaf left on between captures (so that no capture turns a probe on), three
// captures in a row in one process: --tid of one worker, then --tid of
// another (the worker the first left out must now be in the trace, and the
// first must not), then --max-depth 1 with the first worker again (work
// only: leaf runs one call deeper; the worker the second left out is in). Both providers: the cyg hooks make the verdict in
// assembly, the fentry hooks in C (ep_filter_verdict).
func TestTraceFilterVerdictRenewed(t *testing.T) {
	for _, spec := range []testutil.Spec{
		{Sources: []string{"mt.c"}},
		{Sources: []string{"mt.c"}, NoInstr: true, Profile: testutil.ProfileFentry},
	} {
		t.Run(spec.String(), func(t *testing.T) { filterVerdictRenewed(t, startColdSpec(t, spec, nil)) })
	}
}

// filterVerdictRenewed is TestTraceFilterVerdictRenewed on one build of mt.c.
func filterVerdictRenewed(t *testing.T, p *testutil.Process) {
	w := workerTids(t, p.Pid)
	if len(w) < 2 {
		t.Fatalf("want two workers, found %v", w)
	}
	pid := fmt.Sprint(p.Pid)
	run(t, "--pid", pid, "--enable", "work", "--enable", "leaf")
	dir := t.TempDir()
	for i, tid := range w[:2] {
		out := filepath.Join(dir, fmt.Sprintf("tid%d.json", i))
		run(t, "trace", "--pid", pid, "--tid", strconv.Itoa(tid), "--duration", "60s", "--max-calls", "2000", "-o", out)
		per := map[int]int{}
		for _, c := range chromeCalls(t, out) {
			per[c.Tid]++
		}
		if per[tid] < 2000 || len(per) != 1 {
			t.Errorf("capture %d with --tid %d: calls by thread %v; want at least 2000, all of thread %d", i+1, tid, per, tid)
		}
	}
	// The first worker again, now by depth: the second capture left it out,
	// so its calls reach this one only if that verdict was renewed. (Not
	// every worker: on a loaded machine one of them can fill a capture's
	// calls within its time slice before another runs, as seen at load 15.)
	out := filepath.Join(dir, "depth.json")
	run(t, "trace", "--pid", pid, "--max-depth", "1", "--tid", strconv.Itoa(w[0]), "--duration", "60s", "--max-calls", "2000", "-o", out)
	per := map[int]int{}
	for _, c := range chromeCalls(t, out) {
		if c.Name != "work" {
			t.Fatalf("--max-depth 1 traced %q", c.Name)
		}
		per[c.Tid]++
	}
	if per[w[0]] < 2000 || len(per) != 1 {
		t.Errorf("--max-depth 1 --tid %d: calls by thread %v; want at least 2000 work calls, all of thread %d", w[0], per, w[0])
	}
	run(t, "--pid", pid, "--disable", "work", "--disable", "leaf")
	allOff(t, p)
}

// traceTids traces mt.c's work and leaf with --tid naming its first n
// workers until minCalls calls: every call must be one of those threads',
// each of them must have some, and the program must end with wrong=0.
func traceTids(t *testing.T, n, minCalls int) {
	p := startCold(t)
	w := workerTids(t, p.Pid)
	if len(w) <= n {
		t.Fatalf("want more than %d workers, found %v", n, w)
	}
	args := []string{"trace", "--pid", fmt.Sprint(p.Pid), "--enable", "work", "--enable", "leaf"}
	for _, tid := range w[:n] {
		args = append(args, "--tid", strconv.Itoa(tid))
	}
	out := filepath.Join(t.TempDir(), "trace.json")
	run(t, append(args, "--duration", "60s", "--max-calls", strconv.Itoa(minCalls), "-o", out)...)
	calls := chromeCalls(t, out)
	per := map[int]int{}
	for _, c := range calls {
		per[c.Tid]++
	}
	listed := 0
	for _, tid := range w[:n] {
		if per[tid] == 0 {
			t.Errorf("thread %d is listed but has no call in the trace", tid)
		}
		listed += per[tid]
	}
	if len(calls) < minCalls || listed != len(calls) {
		t.Errorf("%d calls by thread: %v; want at least %d, all of threads %v", len(calls), per, minCalls, w[:n])
	}
	allOff(t, p)
	if out, _ := p.Finish(); !strings.Contains(out, "wrong=0") {
		t.Fatalf("program output %q", out)
	}
}

// TestTraceRate: with --rate 50 each of mt.c's hot functions records 50
// calls in every one-second quota epoch of the capture (its threads make
// millions of calls a second), and the trace holds exactly those calls
// (D55): none taken in the epoch before the capture (whatever control word
// their hook read), none lost to a hook in flight at the start or the end.
func TestTraceRate(t *testing.T) {
	const rate = 50
	p := startCold(t)
	out := filepath.Join(t.TempDir(), "trace.json")
	r := run(t, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "work", "--enable", "leaf", "--rate", strconv.Itoa(rate),
		"--duration", "1500ms", "-o", out, "--json")
	var sum struct {
		Epochs   int    `json:"rate_epochs"`
		InFlight *int   `json:"rate_in_flight"`
		Dropped  uint64 `json:"dropped_events"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &sum); err != nil || sum.Dropped != 0 || sum.Epochs < 1 || sum.InFlight == nil || *sum.InFlight != 0 {
		t.Fatalf("summary %q (%v): want no drops, at least one epoch, no hook in flight", r.Stdout, err)
	}
	n := map[string]int{}
	for _, c := range chromeCalls(t, out) {
		n[c.Name]++
	}
	for _, f := range []string{"work", "leaf"} {
		if n[f] != rate*sum.Epochs {
			t.Errorf("%s traced %d times in %d epochs of --rate %d; want exactly %d", f, n[f], sum.Epochs, rate, rate*sum.Epochs)
		}
	}
	allOff(t, p)
	if out, _ := p.Finish(); !strings.Contains(out, "wrong=0") {
		t.Fatalf("program output %q", out)
	}
}

// TestTraceMinDuration: with --min-duration 50us no traced call lasted
// less, and every outer() call in the trace holds exactly its ten slow()
// calls (100 µs each), whose enters were written at their exits together
// with outer's; fast() calls (nanoseconds) are left out.
func TestTraceMinDuration(t *testing.T) {
	testutil.RequirePtrace(t)
	const minUs = 50.0
	for _, spec := range []testutil.Spec{
		{Sources: []string{"durations.c"}},
		{Sources: []string{"durations.c"}, NoInstr: true, Profile: testutil.ProfileFentry},
	} {
		t.Run(spec.String(), func(t *testing.T) {
			p := startColdSpec(t, spec, nil)
			out := filepath.Join(t.TempDir(), "trace.json")
			r := run(t, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "outer", "--enable", "fast", "--enable", "slow",
				"--min-duration", "50us", "--ring-events", "65536", "--duration", "60s", "--max-calls", "1100", "-o", out, "--json")
			var sum struct {
				Dropped uint64 `json:"dropped_events"`
			}
			if err := json.Unmarshal([]byte(r.Stdout), &sum); err != nil || sum.Dropped != 0 {
				t.Fatalf("summary %q (%v): want no drops", r.Stdout, err)
			}
			calls := chromeCalls(t, out)
			var outers, slows []slice
			for _, c := range calls {
				if c.Dur+eps < minUs {
					t.Errorf("%s lasted %.3f µs, under the minimum", c.Name, c.Dur)
				}
				switch c.Name {
				case "outer":
					outers = append(outers, c)
				case "slow":
					slows = append(slows, c)
				}
			}
			// the last outer may still have been running when the capture ended
			if len(outers) < 10 {
				t.Fatalf("%d outer calls in %d", len(outers), len(calls))
			}
			for _, o := range outers[:len(outers)-1] {
				n := 0
				for _, s := range slows {
					if s.Tid == o.Tid && within(s, o) {
						n++
					}
				}
				if n != 10 {
					t.Errorf("outer at %.3f µs holds %d slow calls; want 10", o.Ts, n)
				}
			}
			allOff(t, p)
			if o, _ := p.Finish(); !strings.HasPrefix(o, "done ") {
				t.Fatalf("program output %q", o)
			}
		})
	}
}
