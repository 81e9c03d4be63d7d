//go:build reviewbugs

package capture

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// Review (hostile): --args with --min-duration. A call that lasted long
// enough is in the trace; its arguments, copied at its entry, must be too
// (or the capture must refuse the combination). --min-duration 1ns keeps
// every call, so every t_tail call must show its arguments and return value
// as the program logged them, as TestTraceArgsWithDepthFilter checks for
// --max-depth.
func TestReviewTraceArgsWithMinDuration(t *testing.T) {
	testutil.RequirePtrace(t)
	lib := testutil.Runtime(t, "gcc")
	fx := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O0", Sources: []string{"argslive.c"}, Profile: testutil.ProfileFentry, NoInstr: true, LDFlags: []string{"-pthread"}})
	if r := testutil.Run(t, "coldpatch", fx.Path); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	logFile := filepath.Join(t.TempDir(), "calls.log")
	p := testutil.Start(t, []string{"LD_PRELOAD=" + lib}, fx.Path, logFile)
	r := testutil.Run(t, "hotpatch", "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "t_tail", "--args", "t_tail", "--retval", "t_tail",
		"--min-duration", "1ns", "--duration", "60s", "--max-calls", "10", "--format", "text")
	p.Finish()
	if r.Code != 0 {
		if strings.Contains(r.Stderr, "min-duration") && strings.Count(strings.TrimSpace(r.Stderr), "\n") == 0 {
			return // refused with a one-line reason: acceptable
		}
		t.Fatalf("exit %d: %s", r.Code, r.Stderr)
	}
	logged := loggedCalls(t, logFile)
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
		t.Fatalf("%d t_tail calls with arguments and return value in:\n%.3000s", n, r.Stdout)
	}
}
