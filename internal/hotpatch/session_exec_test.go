package hotpatch

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestSessionTargetExecs: a program that execs (itself, non-PIE: its sites
// at the same addresses) during a session is not written to: the next
// command fails saying the program ran exec, with exit 4, the session ends
// with exit status 4, and the new image's probes are as it started them.
func TestSessionTargetExecs(t *testing.T) {
	testutil.RequirePtrace(t)
	lib := testutil.Runtime(t, "gcc")
	fx := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", PIE: testutil.Bool(false), Sources: []string{"reexec.c"}})
	if r := testutil.Run(t, "coldpatch", fx.Path); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	p := testutil.Start(t, []string{"LD_PRELOAD=" + lib}, fx.Path)
	s := &subject{Process: p}
	ss := startSession(t, s)
	ss.send(t, "enable work")
	if l := ss.read(t); !l.OK || l.Changed != 2 {
		t.Fatalf("enable work: %+v", l)
	}
	if err := syscall.Kill(p.Pid, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	// The new image has "1" as its last argument.
	for deadline := time.Now().Add(time.Minute); ; runtime.Gosched() {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.Pid))
		if strings.HasSuffix(string(b), "\x001\x00") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the program did not exec within a minute of SIGUSR1")
		}
	}
	ss.send(t, "enable work")
	l := ss.read(t)
	if l.OK || l.Exit != 4 || !strings.Contains(l.Error, "ran exec") {
		t.Fatalf("the command after the exec: %+v; want exit 4 saying the program ran exec", l)
	}
	err := ss.cmd.Wait()
	if ee, ok := err.(interface{ ExitCode() int }); !ok || ee.ExitCode() != 4 {
		t.Fatalf("session: %v (stderr %q), want exit status 4", err, ss.stderr.String())
	}
	r := testutil.Run(t, "hotpatch", "list", "--pid", fmt.Sprint(p.Pid))
	for _, line := range strings.Split(r.Stdout, "\n") {
		if strings.Contains(line, " work ") && !strings.Contains(line, " off ") {
			t.Errorf("the new image's probe was changed: %s", line)
		}
	}
	if out, _ := p.Finish(); !strings.Contains(out, "done 1") {
		t.Fatalf("program output %q, want done 1 (the new image ended)", out)
	}
}
