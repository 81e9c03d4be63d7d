package testutil

import (
	"os/exec"
	"runtime"
	"sync"
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
