package testutil

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestStartOutlivesItsThread: a fixture started from a goroutine whose
// locked thread then exits, as a tracer's does at its Detach, runs on and
// finishes cleanly. Started from that thread itself, the fixture got its
// parent-death SIGKILL there (TestSessionReusesReadInBatch failed so in a
// make test: "signal: killed").
func TestStartOutlivesItsThread(t *testing.T) {
	fx := Build(t, Spec{Sources: []string{"mt.c", "hooks.c"}})
	type started struct {
		p   *Process
		tid int
	}
	c := make(chan started, 1)
	var body func()
	body = func() {
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		if unix.Gettid() == unix.Getpid() {
			// Go parks the main thread instead of ending it: as a
			// tracer does (ptrace's lockThread), go on from another.
			go body()
			return
		}
		c <- started{Start(t, nil, fx.Path), unix.Gettid()}
	}
	go body()
	s := <-c
	task := fmt.Sprintf("/proc/self/task/%d", s.tid)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(task); os.IsNotExist(err) {
			break // the thread is gone: a parent-death signal would have been sent
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d that started the fixture has not exited", s.tid)
		}
		runtime.Gosched()
	}
	if !s.p.Alive() {
		t.Fatalf("pid %d died with the thread that started it: %v", s.p.Pid, s.p.Wait())
	}
	s.p.Finish() // fails the test unless it exits cleanly
}
