package capture

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestTraceArgsMatchProgram: a live trace with --args --retval records, for
// every call it holds, the arguments and return value the program itself
// logged for that call (ints, pointers, strings copied at entry, doubles,
// floats, small structs in registers, both ways), and says why for what
// cannot be recorded (stack arguments past 64 bytes, variadic arguments,
// unreadable strings). gcc and clang, -O0 and -O2, fentry probes.
func TestTraceArgsMatchProgram(t *testing.T) {
	testutil.RequirePtrace(t)
	for _, cc := range []string{"gcc", "clang"} {
		for _, opt := range []string{"-O0", "-O2"} {
			spec := testutil.Spec{Compiler: cc, Opt: opt, Sources: []string{"argslive.c"}, Profile: testutil.ProfileFentry, NoInstr: true, LDFlags: []string{"-pthread"}}
			t.Run(spec.String(), func(t *testing.T) { checkLiveArgs(t, spec) })
		}
	}
}

// startArgsLive builds argslive.c (gcc opt, -pg -mfentry), coldpatches it and
// starts it under the gcc-built runtime with env added, logging its calls to
// the file it returns.
func startArgsLive(t *testing.T, opt string, env ...string) (*testutil.Process, string) {
	t.Helper()
	logFile := filepath.Join(t.TempDir(), "calls.log")
	spec := testutil.Spec{Compiler: "gcc", Opt: opt, Sources: []string{"argslive.c"}, Profile: testutil.ProfileFentry, NoInstr: true, LDFlags: []string{"-pthread"}}
	return startColdSpec(t, spec, env, logFile), logFile
}

// fpText replaces the program's D(%a) and F(%a) by the trace's text for the
// same double or float.
var fpText = regexp.MustCompile(`([DF])\(([^)]*)\)`)

func normalise(t *testing.T, s string) string {
	return fpText.ReplaceAllStringFunc(s, func(m string) string {
		sub := fpText.FindStringSubmatch(m)
		f, err := strconv.ParseFloat(sub[2], 64)
		if err != nil {
			t.Fatalf("program printed %q", m)
		}
		if sub[1] == "F" {
			return strconv.FormatFloat(f, 'g', -1, 32)
		}
		return strconv.FormatFloat(f, 'g', -1, 64)
	})
}

func checkLiveArgs(t *testing.T, spec testutil.Spec) {
	lib := testutil.Runtime(t, "gcc")
	fx := testutil.Build(t, spec)
	if r := testutil.Run(t, "coldpatch", fx.Path); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	logFile := filepath.Join(t.TempDir(), "calls.log")
	// Rings big enough that no record is dropped at this rate.
	p := testutil.Start(t, []string{"LD_PRELOAD=" + lib, "EDGEPROBE_RING_EVENTS=65536"}, fx.Path, logFile)
	out := filepath.Join(t.TempDir(), "trace.json")
	const funcs = 13
	const calls = 100 * funcs // 100 iterations
	r := run(t, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "t_*", "--args", "t_*", "--retval", "t_*",
		"--duration", "60s", "--max-calls", fmt.Sprint(calls), "-o", out, "--json")
	var sum struct {
		Dropped  uint64 `json:"dropped_events"`
		Calls    int    `json:"calls"`
		ArgFuncs int    `json:"arg_functions"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &sum); err != nil {
		t.Fatalf("summary: %v: %q", err, r.Stdout)
	}
	if sum.Dropped != 0 || sum.Calls < calls || sum.ArgFuncs != funcs {
		t.Fatalf("summary %+v: want no drops, >= %d calls, %d functions with arguments", sum, calls, funcs)
	}
	if o, _ := p.Finish(); !strings.HasPrefix(o, "done ") {
		t.Fatalf("program output %q", o)
	}
	logged := loggedCalls(t, logFile)
	var trace struct {
		TraceEvents []struct {
			Name string            `json:"name"`
			Ph   string            `json:"ph"`
			Args map[string]string `json:"args"`
		} `json:"traceEvents"`
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &trace); err != nil {
		t.Fatal(err)
	}
	checked, values := map[string]int{}, 0
	for _, e := range trace.TraceEvents {
		if e.Ph != "X" || !strings.HasPrefix(e.Name, "t_") || e.Args["still_running"] != "" {
			continue // a call the capture's end cut has no return value
		}
		id := e.Args["id"]
		if id == "" {
			id = e.Args["a1"] // t_many
		}
		if id == "" {
			id = strings.TrimPrefix(strings.Split(e.Args["t"], ",")[0], "{a=") // t_mktwo
		}
		want, ok := logged[e.Name+"#"+id]
		if !ok {
			t.Fatalf("%s call %q: the program logged no such call (args %v)", e.Name, id, e.Args)
		}
		if len(e.Args) != len(want) {
			t.Errorf("%s #%s: %d values recorded, program logged %d: %v vs %q", e.Name, id, len(e.Args), len(want), e.Args, want)
			continue
		}
		for _, w := range want {
			name, text, _ := strings.Cut(w, "=")
			if name == "" {
				name = "return"
			}
			got, ok := e.Args[name]
			switch {
			case !ok:
				t.Errorf("%s #%s: %s not in the trace (%v)", e.Name, id, name, e.Args)
			case text == "?":
				if !strings.HasPrefix(got, "?(") || len(got) < 10 {
					t.Errorf("%s #%s: %s = %q, want it not recorded, with the reason", e.Name, id, name, got)
				}
			case strings.HasPrefix(text, "T("): // left by a tail call, or returned
				if got != strings.TrimSuffix(text[2:], ")") && !(strings.HasPrefix(got, "?(") && strings.Contains(got, "tail call")) {
					t.Errorf("%s #%s: %s = %q, want %s or not recorded because of a tail call", e.Name, id, name, got, text[2:len(text)-1])
				}
			case got != normalise(t, text):
				t.Errorf("%s #%s: %s = %q, the program logged %q", e.Name, id, name, got, normalise(t, text))
			default:
				values++
			}
		}
		checked[e.Name]++
	}
	if len(checked) != funcs {
		t.Errorf("calls checked per function: %v, want all %d functions", checked, funcs)
	}
	// Coverage, not correctness (every call above was compared): the
	// capture stops at --max-calls mid-drain, and the rings of threads
	// drained last (t_thr's) may lose a drain's worth of calls to the cut.
	for fn, n := range checked {
		if n < calls/funcs/2 {
			t.Errorf("%s: only %d calls checked", fn, n)
		}
	}
	t.Logf("%d calls, %d values equal to what the program logged (%v)", sum.Calls, values, checked)
}

// loggedCalls reads what argslive.c logged, by "function#iteration".
func loggedCalls(t *testing.T, logFile string) map[string][]string {
	logged := map[string][]string{}
	data, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) < 3 {
			continue // the last line, cut by the stop
		}
		logged[f[1]+"#"+f[0]] = f[2:]
	}
	return logged
}

// splitArgs splits "a=1, p={x=1, y=2}, s=\"a, b\"" at its top-level commas.
func splitArgs(s string) []string {
	var out []string
	depth, quoted, start := 0, false, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case quoted:
		case c == '{' || c == '(':
			depth++
		case c == '}' || c == ')':
			depth--
		case c == ',' && depth == 0 && i+1 < len(s) && s[i+1] == ' ':
			out = append(out, s[start:i])
			start = i + 2
			i++
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// TestTraceArgsPerfettoReplay: the same capture written as a Perfetto trace
// carries the values as debug annotations (names interned) that protoc
// decodes, and 'hotpatch replay' prints each call with the values the
// program logged (floats as the doubles the trace stores).
func TestTraceArgsPerfettoReplay(t *testing.T) {
	testutil.RequireTool(t, "protoc")
	p, logFile := startArgsLive(t, "-O2")
	out := filepath.Join(t.TempDir(), "trace.pftrace")
	run(t, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "t_*", "--args", "t_*", "--retval", "t_*",
		"--duration", "60s", "--max-calls", "260", "--ring-events", "65536", "-o", out)
	if o, _ := p.Finish(); !strings.HasPrefix(o, "done ") {
		t.Fatalf("program output %q", o)
	}
	logged := loggedCalls(t, logFile)
	in, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	cmd := exec.Command("protoc", "--decode_raw")
	cmd.Stdin = in
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("protoc --decode_raw: %v", err)
	}
	for _, want := range []string{`"scale"`, `"unmapped"`, `"return"`, `"GET /index.html"`} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("protoc's decoding holds no %s", want)
		}
	}
	rp := run(t, "replay", out)
	calls, values := 0, 0
	for _, line := range strings.Split(rp.Stdout, "\n") {
		_, call, ok := strings.Cut(line, "] | ")
		if !ok || !strings.HasPrefix(call, "t_") || strings.HasSuffix(call, " {") || strings.Contains(call, "/* still running") {
			continue // a call with traced callees (its return is on its closing line), or cut by the capture's end
		}
		open := strings.IndexByte(call, '(')
		closeAt := strings.LastIndex(call, ") = ")
		if open < 0 || closeAt < 0 || !strings.HasSuffix(call, ";") {
			t.Fatalf("replay line %q", line)
		}
		fn := call[:open]
		got := splitArgs(call[open+1 : closeAt])
		got = append(got, "="+strings.TrimSuffix(call[closeAt+4:], ";"))
		id := ""
		for _, g := range got {
			for _, prefix := range []string{"id=", "a1=", "t={a="} { // t_many, t_mktwo have no id
				if v, ok := strings.CutPrefix(g, prefix); ok && id == "" {
					id = strings.Split(v, ",")[0]
				}
			}
		}
		want, ok := logged[fn+"#"+id]
		if !ok || len(want) != len(got) {
			t.Fatalf("replay %q: the program logged %q", call, want)
		}
		for i, w := range want {
			g := got[i]
			wn, wt, _ := strings.Cut(w, "=")
			gn, gt, _ := strings.Cut(g, "=")
			if wn != gn {
				t.Errorf("%s #%s: value %d is %s, the program logged %s", fn, id, i, gn, wn)
				continue
			}
			if wt == "?" {
				if !strings.HasPrefix(gt, "?(") {
					t.Errorf("%s #%s: %s = %q, want it not recorded", fn, id, gn, gt)
				}
				continue
			}
			if strings.HasPrefix(wt, "T(") { // left by a tail call, or returned
				if gt != strings.TrimSuffix(wt[2:], ")") && !strings.Contains(gt, "tail call") {
					t.Errorf("%s #%s: %s = %q, want %s or not recorded because of a tail call", fn, id, gn, gt, wt)
				}
				continue
			}
			if !sameReplayed(t, gt, wt) {
				t.Errorf("%s #%s: %s = %q in the replay, the program logged %q", fn, id, gn, gt, wt)
			}
			values++
		}
		calls++
	}
	if calls < 260 {
		t.Errorf("replay printed %d calls, want 260", calls)
	}
	t.Logf("replay: %d calls, %d values equal to what the program logged", calls, values)
}

// sameReplayed compares a replayed value with the program's text, leaf by
// leaf: a float (F) was stored as a double, so it is compared as a float.
func sameReplayed(t *testing.T, got, logged string) bool {
	gl, ll := leaves(got), leaves(logged)
	if len(gl) != len(ll) {
		return false
	}
	for i := range ll {
		if m := fpText.FindStringSubmatch(ll[i]); m != nil && len(m[0]) == len(ll[i]) {
			want, err1 := strconv.ParseFloat(m[2], 64)
			g, err2 := strconv.ParseFloat(gl[i], 64)
			if err1 != nil || err2 != nil {
				return false
			}
			if m[1] == "F" && float32(want) != float32(g) || m[1] == "D" && want != g {
				return false
			}
			continue
		}
		if gl[i] != ll[i] {
			return false
		}
	}
	return true
}

// leaves splits "{x=1, y=D(..)}" into its leaf texts (["1", "D(..)"]).
func leaves(s string) []string {
	if !strings.HasPrefix(s, "{") {
		return []string{s}
	}
	var out []string
	for _, f := range splitArgs(strings.TrimSuffix(strings.TrimPrefix(s, "{"), "}")) {
		_, v, _ := strings.Cut(f, "=")
		out = append(out, leaves(v)...)
	}
	return out
}

// TestTraceArgsRingFull: an argument record the ring can never hold (t_many's
// 8 cells in an 8-cell ring that also holds the entry) is dropped and
// counted, and every call the trace keeps says its arguments were not
// recorded and why, naming the flag that keeps them.
func TestTraceArgsRingFull(t *testing.T) {
	p, _ := startArgsLive(t, "-O2")
	out := filepath.Join(t.TempDir(), "trace.json")
	r := run(t, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "t_many", "--args", "t_many", "--retval", "t_many",
		"--duration", "60s", "--max-calls", "20", "--ring-events", "8", "-o", out, "--json")
	p.Finish()
	var sum struct {
		Dropped uint64 `json:"dropped_events"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &sum); err != nil {
		t.Fatal(err)
	}
	var trace struct {
		TraceEvents []struct {
			Name string            `json:"name"`
			Ph   string            `json:"ph"`
			Args map[string]string `json:"args"`
		} `json:"traceEvents"`
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &trace); err != nil {
		t.Fatal(err)
	}
	calls := 0
	for _, e := range trace.TraceEvents {
		if e.Ph != "X" || e.Name != "t_many" {
			continue
		}
		calls++
		for _, a := range []string{"a1", "a6", "a14"} {
			if v := e.Args[a]; !strings.HasPrefix(v, "?(not recorded: the trace ring had no room") || !strings.Contains(v, "--ring-events") {
				t.Fatalf("t_many %s = %q with an 8-event ring", a, v)
			}
		}
	}
	if calls < 20 || sum.Dropped < uint64(calls) {
		t.Fatalf("%d calls, %d events dropped: want 20 calls and a dropped record for each", calls, sum.Dropped)
	}
}

// TestTraceArgsWhatIsOn: without --enable, --args records the functions
// whose probes are on already.
func TestTraceArgsWhatIsOn(t *testing.T) {
	p, logFile := startArgsLive(t, "-O2")
	run(t, "--pid", fmt.Sprint(p.Pid), "--enable", "t_dmul")
	r := run(t, "trace", "--pid", fmt.Sprint(p.Pid), "--args", "t_dmul", "--retval", "t_dmul", "--duration", "60s", "--max-calls", "10", "--format", "text")
	p.Finish()
	logged := loggedCalls(t, logFile)
	line := regexp.MustCompile(`\| t_dmul\((x=[^,]+), (y=[^,]+), id=(\d+)\) = ([^;]+);`)
	n := 0
	for _, m := range line.FindAllStringSubmatch(r.Stdout, -1) {
		want := logged["t_dmul#"+m[3]]
		if len(want) != 4 || !sameReplayed(t, strings.TrimPrefix(m[1], "x="), strings.TrimPrefix(want[0], "x=")) ||
			!sameReplayed(t, strings.TrimPrefix(m[2], "y="), strings.TrimPrefix(want[1], "y=")) || !sameReplayed(t, m[4], strings.TrimPrefix(want[3], "=")) {
			t.Errorf("traced %q, the program logged %q", m[0], want)
		}
		n++
	}
	if n < 10 {
		t.Fatalf("%d t_dmul calls with arguments in:\n%s", n, r.Stdout)
	}
}

// TestTraceAfterKilledCapture: a capture SIGKILLed while it records
// arguments into bigger rings leaves them asked for; the next capture starts
// from the defaults and leaves nothing of either behind.
func TestTraceAfterKilledCapture(t *testing.T) {
	p, _ := startArgsLive(t, "-O2")
	cmd := exec.Command(testutil.Command(t, "hotpatch"), "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "t_dmul", "--args", "t_dmul",
		"--ring-events", "4096", "--duration", "5m", "-o", filepath.Join(t.TempDir(), "t.pftrace"))
	if err := testutil.StartBound(cmd); err != nil {
		t.Fatal(err)
	}
	region, err := shm.OpenPID(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	waitFor(t, "the capture to start", func() bool { return region.Control()&shm.CtlArgs != 0 })
	cmd.Process.Kill()
	cmd.Wait()
	if h := region.Header(); h.RingReq != 4096 || h.Control&shm.CtlArgs == 0 {
		t.Fatalf("after the kill: ring_req %d, control %#x; want what the killed capture set", h.RingReq, h.Control)
	}
	run(t, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "t_dmul", "--duration", "60s", "--max-calls", "5", "--format", "text")
	h := region.Header()
	if h.RingReq != region.RingDefault() || h.Control&(shm.CtlArgs|shm.CtlTrace) != 0 {
		t.Errorf("after the next capture: ring_req %d (default %d), control %#x", h.RingReq, region.RingDefault(), h.Control)
	}
	p.Finish()
}

// TestTraceArgsSeccomp: in a process under a seccomp filter, whose action
// for the string copy's system call could be to kill it, strings are not
// copied: their pointers are recorded, and the capture says why.
func TestTraceArgsSeccomp(t *testing.T) {
	p, _ := startArgsLive(t, "-O2", "ARGSLIVE_SECCOMP=1")
	r := run(t, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "t_pick", "--args", "t_pick", "--retval", "t_pick",
		"--duration", "60s", "--max-calls", "10", "--format", "text")
	p.Finish()
	if !strings.Contains(r.Stderr, "seccomp filter") {
		t.Errorf("no word of the seccomp filter: %q", r.Stderr)
	}
	line := regexp.MustCompile(`\| t_pick\(id=\d+, a=(\S+), b=(\S+)\) = ([^;]+);`)
	n := 0
	for _, m := range line.FindAllStringSubmatch(r.Stdout, -1) {
		for _, v := range m[1:] {
			if !strings.HasPrefix(v, "0x") {
				t.Errorf("%q: a string copied in a process under seccomp", m[0])
			}
		}
		n++
	}
	if n < 10 {
		t.Fatalf("%d t_pick calls in:\n%s", n, r.Stdout)
	}
}

// TestTraceArgsWithDepthFilter: with the runtime's depth filter, the calls
// it keeps have their arguments and return values, and the calls it filters
// out leave no record behind (gcc -O0: t_tail calls t_leafx, one deeper).
func TestTraceArgsWithDepthFilter(t *testing.T) {
	p, logFile := startArgsLive(t, "-O0")
	r := run(t, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "t_tail", "--enable", "t_leafx", "--args", "t_*", "--retval", "t_*",
		"--max-depth", "1", "--duration", "60s", "--max-calls", "10", "--format", "text")
	p.Finish()
	logged := loggedCalls(t, logFile)
	if strings.Contains(r.Stdout, "t_leafx(") {
		t.Errorf("t_leafx, one deeper than --max-depth 1 allows, is in the trace:\n%s", r.Stdout)
	}
	line := regexp.MustCompile(`\| t_tail\(x=(-?\d+), id=(\d+)\) = (-?\d+);`)
	n := 0
	for _, m := range line.FindAllStringSubmatch(r.Stdout, -1) {
		want := logged["t_tail#"+m[2]]
		if len(want) != 3 || want[0] != "x="+m[1] || want[2] != "=T("+m[3]+")" {
			t.Errorf("traced %q, the program logged %q", m[0], want)
		}
		n++
	}
	if n < 10 {
		t.Fatalf("%d t_tail calls with arguments and return value in:\n%s", n, r.Stdout)
	}
}

// TestTraceArgsCyg: --args on a cyg probe says what it can record and why
// not the arguments, and fails without any fentry function to record.
func TestTraceArgsCyg(t *testing.T) {
	p := startCold(t)
	r := testutil.Run(t, "hotpatch", "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "leaf", "--args", "leaf",
		"--duration", "100ms", "--format", "text")
	if r.Code == 0 {
		t.Fatalf("--args on cyg probes only succeeded: %s", r.Stdout)
	}
	for _, want := range []string{"leaf: a cyg probe", "which function ran and when", "after the prologue", "fentry"} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("message %q does not say %q", r.Stderr, want)
		}
	}
	if strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
		t.Errorf("not a one-line error: %q", r.Stderr)
	}
	allOff(t, p)
}
