package testutil

import (
	"bytes"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// A fixture dies with the thread that started it (Pdeathsig is per
// thread, not per process), and a Go thread exits when a goroutine locked
// to it returns: a tracer's (ptrace.Run, a tracer goroutine) does, at its
// Detach. A fixture started from a thread a tracer later locked died with
// the tracer (SIGKILL, the test failing with "signal: killed"), whichever
// test goroutine had started it. So every fixture is started from one
// thread kept for that and nothing else: locked by a goroutine that never
// returns, so no other goroutine runs on it and it never exits.
var spawner struct {
	once sync.Once
	reqs chan func()
}

// StartCmd starts cmd (cmd.Start) from the spawner thread. Use it for any
// command that sets Pdeathsig.
func StartCmd(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: the thread outlives every fixture
			for fn := range spawner.reqs {
				fn()
			}
		}()
	})
	errc := make(chan error, 1)
	spawner.reqs <- func() { errc <- cmd.Start() }
	return <-errc
}

// Bind makes cmd die with the test process: SIGKILL as its parent-death
// signal (kept with whatever else cmd.SysProcAttr sets, as the other user's
// credentials: Go sets the signal after them, so the change of user does
// not clear it). A test binary killed by its timeout, a panic or a SIGKILL
// runs no cleanup; without this its fixtures and hotpatch runs live on with
// init as their parent (one spun at 95% CPU for an hour). Start the command
// with StartCmd (StartBound, RunBound, OutputBound do both): the signal is
// sent when the thread that forked exits, and only the spawner thread
// never does before the process.
func Bind(cmd *exec.Cmd) *exec.Cmd {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	return cmd
}

// StartBound is cmd.Start for a command that must die with the test
// process (Bind, from the spawner thread).
func StartBound(cmd *exec.Cmd) error { return StartCmd(Bind(cmd)) }

// RunBound is cmd.Run for a command that must die with the test process.
func RunBound(cmd *exec.Cmd) error {
	if err := StartBound(cmd); err != nil {
		return err
	}
	return cmd.Wait()
}

// OutputBound is cmd.Output for a command that must die with the test
// process (stderr, when not set, is kept in the *exec.ExitError as Output
// keeps it).
func OutputBound(cmd *exec.Cmd) ([]byte, error) {
	var out, errb bytes.Buffer
	cmd.Stdout = &out
	captured := cmd.Stderr == nil
	if captured {
		cmd.Stderr = &errb
	}
	err := RunBound(cmd)
	if ee, ok := err.(*exec.ExitError); ok && captured {
		ee.Stderr = errb.Bytes()
	}
	return out.Bytes(), err
}

// CombinedOutputBound is cmd.CombinedOutput for a command that must die
// with the test process.
func CombinedOutputBound(cmd *exec.Cmd) ([]byte, error) {
	var b SyncBuffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := RunBound(cmd)
	return []byte(b.String()), err
}
