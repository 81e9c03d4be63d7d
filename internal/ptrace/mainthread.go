package ptrace

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// lockThread locks the calling goroutine to its OS thread for good, for a
// tracer: the thread exits with the goroutine, which is what releases a
// tracee still traced (the leader-only mode's detach). The process's main
// thread cannot be that thread: Go never exits it (it parks it instead),
// so the kernel would never release what it traces. lockThread reports
// false there: the caller starts its work again on a new goroutine and
// returns, and the main thread, still locked to the returning goroutine,
// is parked by Go for the rest of the process; no goroutine runs on it
// again, so no later one lands there.
//
// (Before D71 an init function locked the main goroutine to the main
// thread for the life of the process, which kept tracers off it too; but
// every time a locked goroutine blocks, the scheduler hands its P to
// another thread and wakes the locked one to take it back: a few context
// switches for each channel receive, signal registration or sleep of the
// command's main goroutine.)
func lockThread() bool {
	runtime.LockOSThread()
	return unix.Gettid() != unix.Getpid()
}
