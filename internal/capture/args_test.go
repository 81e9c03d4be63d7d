package capture

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

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
			spec := testutil.Spec{Compiler: cc, Opt: opt, Sources: []string{"argslive.c"}, Profile: testutil.ProfileFentry, NoInstr: true}
			t.Run(spec.String(), func(t *testing.T) { checkLiveArgs(t, spec) })
		}
	}
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
	const calls = 900 // 100 iterations of the 9 functions
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
	if sum.Dropped != 0 || sum.Calls < calls || sum.ArgFuncs != 9 {
		t.Fatalf("summary %+v: want no drops, >= %d calls, 9 functions with arguments", sum, calls)
	}
	if o, _ := p.Finish(); !strings.HasPrefix(o, "done ") {
		t.Fatalf("program output %q", o)
	}
	// What the program logged, by (function, iteration).
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
		if e.Ph != "X" || !strings.HasPrefix(e.Name, "t_") {
			continue
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
			case got != normalise(t, text):
				t.Errorf("%s #%s: %s = %q, the program logged %q", e.Name, id, name, got, normalise(t, text))
			default:
				values++
			}
		}
		checked[e.Name]++
	}
	if len(checked) != 9 {
		t.Errorf("calls checked per function: %v, want all 9 functions", checked)
	}
	for fn, n := range checked {
		if n < calls/9-2 {
			t.Errorf("%s: only %d calls checked", fn, n)
		}
	}
	t.Logf("%d calls, %d values equal to what the program logged (%v)", sum.Calls, values, checked)
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
