package ptrace_test

import (
	"bufio"
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// A thread that attach finds inside clone(CLONE_VFORK) is marked as blocked
// in vfork, so StopAll and Sync do not wait for it. When that clone sleeps
// before its child exists and then fails (here: a userfaultfd fault on its
// arguments, then an invalid exit_signal; in life a cgroup pids limit or
// ENOMEM after reclaim), no VFORK_DONE event ever clears the mark: before
// the fix the thread went back to user code unheld, and every later
// StopAll (the stop protocol's "every thread stopped" while it rewrites
// sites, a runtime load's borrow) returned with it running.
func TestVforkMarkFailedClone(t *testing.T) {
	testutil.RequirePtrace(t)
	fix := testutil.Build(t, testutil.Spec{Sources: []string{"vforkfail.c"}, NoInstr: true})
	cmd := exec.Command(fix.Path)
	var stderr testutil.SyncBuffer
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := testutil.StartBound(cmd); err != nil {
		t.Fatal(err)
	}
	done := false
	t.Cleanup(func() {
		if !done {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	out := bufio.NewReader(outp)
	line, err := out.ReadString('\n')
	if strings.HasPrefix(line, "unavailable") {
		testutil.Unavailable(t, "vforkfail: %s", strings.TrimSpace(line))
	}
	if err != nil || !strings.HasPrefix(line, "ready") {
		t.Fatalf("no ready line: %q %v (stderr %s)", line, err, stderr.String())
	}
	pid := cmd.Process.Pid
	tr, err := ptrace.Attach(pid, ptrace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Detach()
	// Let the clone fail; the cloner spins in user mode from then on.
	if _, err := in.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	line, err = out.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "cloned rc=-1") {
		t.Fatalf("the clone did not fail as set up: %q %v", line, err)
	}
	t.Logf("fixture: %s", strings.TrimSpace(line))
	states, err := tr.StopAll(context.Background())
	if err != nil {
		_ = tr.ResumeAll()
		t.Fatal(err)
	}
	// Every thread must be in a ptrace-stop now, the cloner too.
	for tid, s := range taskStates(t, pid) {
		if !strings.HasPrefix(s, "t") {
			t.Errorf("StopAll returned (%d states) with thread %d %s: not stopped", len(states), tid, s)
		}
	}
	if err := tr.ResumeAll(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Detach(); err != nil {
		t.Fatal(err)
	}
	in.Write([]byte("stop\n"))
	in.Close()
	line, _ = out.ReadString('\n')
	err = cmd.Wait()
	done = true
	if err != nil || !strings.HasPrefix(line, "done") {
		t.Fatalf("fixture ended %v: %q (stderr %s)", err, line, stderr.String())
	}
}
