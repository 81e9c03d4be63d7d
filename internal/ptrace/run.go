package ptrace

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// Run runs fn on a new goroutine locked to a new OS thread, which exits
// when fn returns, and waits for it. The first tracer fn attaches (Attach,
// from fn's own goroutine) is served on that thread itself: its requests
// run inline, on the caller's goroutine, with no tracer goroutine and so
// no hand-off per request, which between two locked threads costs a few
// context switches each way (a one-shot hotpatch made hundreds: D71). It
// still pumps the target's events before each request and whenever it
// waits, so a stop of the target waits at most until the next request.
//
// The rules stay those of every tracer: one tracer per locked thread (a
// second Attach inside fn gets a tracer goroutine of its own), requests
// only from the tracer thread (Do from another goroutine fails with
// ErrWrongThread), EINTR-safe waits. fn must not start child processes
// while the inline tracer is attached: its wait for events would reap them.
//
// The inline tracer's Detach leaves to the thread's exit what the
// tracer-goroutine Detach leaves to its goroutine's (the leader-only mode
// stops nothing, so the kernel's release at the tracer thread's exit is
// its detach); Run returns only once no thread of the process is traced
// by that thread any more (awaitRelease), so whatever the caller does
// next (print, exit, attach again) comes after the release, as it does
// after Detach.
func Run(fn func() error) error {
	if runOf(unix.Gettid()) != nil {
		return fn() // already on a Run thread
	}
	type result struct {
		err error
		rt  *runThread
	}
	done := make(chan result, 1)
	var body func()
	body = func() {
		// Locked and never unlocked: the thread exits with the goroutine,
		// which is what releases a leader-only tracer's tracee.
		if !lockThread() {
			go body() // the main thread: not this one
			return
		}
		tid := unix.Gettid()
		// A thread pidfd turns readable when the thread has exited
		// (Linux 6.9; else it is -1 and the wait polls /proc).
		rt := &runThread{tid: tid, pidfd: threadPidfd(tid)}
		runs.Lock()
		runs.m[rt.tid] = rt
		runs.Unlock()
		err := fn()
		runs.Lock()
		delete(runs.m, rt.tid)
		runs.Unlock()
		done <- result{err, rt}
	}
	go body()
	r := <-done
	if t := r.rt.inline; t != nil {
		if rerr := t.awaitRelease(); r.err == nil {
			r.err = rerr
		}
	}
	if r.rt.pidfd >= 0 {
		unix.Close(r.rt.pidfd)
	}
	return r.err
}

// runThread is one Run's thread: its id and the tracer served inline on it.
type runThread struct {
	tid    int
	pidfd  int     // the thread's pidfd, or -1
	inline *Tracer // set once, by the first Attach on the thread
}

var runs = struct {
	sync.Mutex
	m map[int]*runThread
}{m: map[int]*runThread{}}

func runOf(tid int) *runThread {
	runs.Lock()
	defer runs.Unlock()
	return runs.m[tid]
}

// claimInline returns the Run thread the caller is on if no tracer was
// attached inline on it yet, marking it taken by t; else nil.
func claimInline(t *Tracer) *runThread {
	runs.Lock()
	defer runs.Unlock()
	rt := runs.m[unix.Gettid()]
	if rt == nil || rt.inline != nil {
		return nil
	}
	rt.inline = t
	return rt
}

// attachInline attaches t on the calling Run thread, as serve would on its
// own. An attach that seized nothing gives the place back; one that failed
// after seizing keeps it, so that Run waits for the thread's exit to
// release what it seized.
func (t *Tracer) attachInline(rt *runThread) error {
	t.inline = true
	t.tid = rt.tid
	t.pidfd = rt.pidfd // Run's: Run closes it
	// SIGCHLD is registered by the first wait that sleeps (sleepy).
	if err := t.attach(); err != nil {
		t.stopChld()
		seized := len(t.threads) > 0
		t.cleanup()
		if !seized {
			runs.Lock()
			rt.inline = nil
			runs.Unlock()
		}
		return err
	}
	return nil
}

func (t *Tracer) wrongThread() error {
	return fmt.Errorf("pid %d: request from thread %d to the tracer served inline on thread %d: %w", t.pid, unix.Gettid(), t.tid, ErrWrongThread)
}
