package ptrace

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// ErrCall: a function called in the target on a borrowed thread did not
// return normally (it faulted, or did not return in time).
var ErrCall = errors.New("call in the target failed")

// Restart values a system call interrupted by a stop leaves in rax (the
// kernel's -ERESTART* codes); with orig_rax >= 0 they make the kernel
// re-issue the call when the thread resumes without a signal handler to run.
const (
	errRestartSys    = 512
	errRestartNoIntr = 513
	errRestartNoHand = 514
	errRestartBlock  = 516 // nanosleep and friends: restart_syscall, remaining time
	redZone          = 128 // the System V red zone below rsp, which leaf code may use
	callScratch      = 64  // a little room between the red zone and our frame
	defaultCallLimit = 5 * time.Second
	eflagsDirection  = 0x400 // DF must be clear at a call (ABI)
	callReturnAddr   = 0     // the return address we push: returning there faults at rip 0
)

// BorrowMask is the blocked-signal mask of a borrowed thread: everything
// but signals 32 and 33 (glibc's SIGCANCEL and SIGSETXID).
const BorrowMask = ^uint64(0) &^ (1<<31 | 1<<32)

// InSyscall reports whether a stopped thread's registers show it inside a
// system call (orig_rax >= 0), which one, and whether the call will be
// restarted when the thread resumes (rax holds an -ERESTART* code).
func InSyscall(r *Regs) (nr int, restart bool, ok bool) {
	if int64(r.Orig_rax) < 0 {
		return 0, false, false
	}
	switch -int64(r.Rax) {
	case errRestartSys, errRestartNoIntr, errRestartNoHand, errRestartBlock:
		restart = true
	}
	return int(r.Orig_rax), restart, true
}

// Borrowed is one thread of the target lent to the caller of Borrow for
// function calls. Its registers and extended (FPU/vector) state are saved
// when it is borrowed and restored exactly when Borrow returns.
type Borrowed struct {
	t        *Tracer
	th       *thread
	regs     Regs
	xstate   []byte
	deferred []siginfo // signals that arrived for the thread meanwhile
	sigmask  uint64    // its blocked-signal mask, restored at the end
	sigStop  bool      // the thread is in a signal-delivery-stop (a signal can be injected)
	parked   bool      // Park put its own registers, xstate and mask back (Call sets the mask again)
	// Limit bounds each Call (zero: 5s).
	Limit time.Duration
	// Restorer, when set, is the address of an rt_sigreturn trampoline in
	// the target (RestorerCode; glibc's __restore_rt): each Call then
	// returns there over a signal frame of the borrowed state, so that the
	// thread goes on unharmed if the tracer dies during the call, and ends
	// parked (see safecall.go). Call then returns the result of the last
	// system call the function made, not its rax; Created tells whether it
	// made a thread. Not used when the borrow began with a signal to deliver
	// and SyscallFn is not set.
	Restorer uint64
	// SyscallFn is libc's syscall() in the target: with a Restorer, a
	// thread borrowed with a signal to deliver first queues that signal
	// again to itself through it (requeue), then calls as any other.
	SyscallFn uint64
	// Created is the thread the last Call created (a clone event), or 0.
	Created    int
	withSignal bool // borrowed in a signal-delivery-stop
	// OnResume, when set, runs each time a Call has set the thread going
	// (tests: a tracer that dies while the thread runs the call).
	OnResume func()
}

// Tid is the borrowed thread.
func (b *Borrowed) Tid() int { return b.th.tid }

// Regs are the thread's registers as they were when it was borrowed.
func (b *Borrowed) Regs() Regs { return b.regs }

// ReadMem and WriteMem access the target's memory; inside Borrow's fn they
// run directly on the tracer thread.
func (b *Borrowed) ReadMem(addr uint64, p []byte) error  { return memRead(b.t.mem, addr, p) }
func (b *Borrowed) WriteMem(addr uint64, p []byte) error { return memWrite(b.t.mem, addr, p) }

// Borrow lends thread tid to fn. The process must be held by StopAll. Every
// other thread resumes first and keeps running while fn runs (locks they
// hold get released, so a call on the borrowed thread cannot wait for a
// thread we stopped); the borrowed thread's registers and xstate are saved.
// When fn returns, the thread's registers and xstate are written back, a
// system call it was interrupted in is restarted by the kernel as after any
// stop (a read loses no byte, a nanosleep sleeps its full time), signals
// that arrived for it during the calls are delivered then, with their
// original siginfo, and the hold ends. fn runs on the tracer thread.
func (t *Tracer) Borrow(tid int, fn func(b *Borrowed) error) error {
	return t.Do(func() error {
		if err := t.needAll("borrow"); err != nil {
			return err
		}
		th := t.threads[tid]
		if th == nil || !t.hold || th.kind == running {
			return fmt.Errorf("borrow thread %d of pid %d: not held by StopAll", tid, t.pid)
		}
		if th.kind == stopGroup || th.kind == stopTrap {
			return fmt.Errorf("borrow thread %d of pid %d: it is group-stopped or held at a trap", tid, t.pid)
		}
		b := &Borrowed{t: t, th: th}
		if err := unix.PtraceGetRegs(tid, &b.regs); err != nil {
			return fmt.Errorf("borrow thread %d: registers: %w", tid, mapErrno(err))
		}
		xs, err := getXstate(tid)
		if err != nil {
			return fmt.Errorf("borrow thread %d: xstate: %w", tid, mapErrno(err))
		}
		b.xstate = xs
		// Block every signal for the thread while it is borrowed (but
		// glibc's SIGCANCEL and SIGSETXID: setuid() in another thread waits
		// for every thread to take SIGSETXID): a signal for it stays pending
		// and is delivered when its own mask is back, with its own siginfo,
		// where its code was stopped; none runs a handler on top of our
		// frames, and a stream of them cannot keep a call from ending. A
		// thread it creates inherits the mask (the loader thread runs with
		// it).
		if b.sigmask, err = getSigmask(tid); err != nil {
			return fmt.Errorf("borrow thread %d: signal mask: %w", tid, mapErrno(err))
		}
		if err := setSigmask(tid, BorrowMask); err != nil {
			return fmt.Errorf("borrow thread %d: signal mask: %w", tid, mapErrno(err))
		}
		if th.kind == stopSignal {
			// A signal was about to be delivered: deliver it after the restore.
			if si, err := getSiginfo(tid); err == nil {
				b.deferred = append(b.deferred, si)
				b.sigStop = true
				b.withSignal = true
			}
		}
		th.kind = stopPlain
		t.hold = false
		for _, o := range t.threads {
			if o != th && o.kind != stopTrap {
				t.resume(o)
			}
		}
		ferr := fn(b)
		if rerr := b.restore(); rerr != nil && ferr == nil {
			ferr = rerr
		}
		return ferr
	})
}

// Call calls the function at fn with up to six integer arguments on the
// borrowed thread and returns rax. The frame goes below the thread's red
// zone, 16-byte aligned as at a call; the return address is 0, so the
// return faults at rip 0, which ends the call. orig_rax is set to -1 so
// that the kernel does not apply the interrupted system call's restart to
// our registers.
func (b *Borrowed) Call(ctx context.Context, fn uint64, args ...uint64) (uint64, error) {
	t, tid := b.t, b.th.tid
	if len(args) > 6 {
		return 0, fmt.Errorf("call %#x: %d arguments (at most 6)", fn, len(args))
	}
	if err := t.usable(); err != nil {
		return 0, err
	}
	if b.parked {
		if err := setSigmask(tid, BorrowMask); err != nil {
			return 0, fmt.Errorf("call %#x: signal mask: %w", fn, mapErrno(err))
		}
		b.parked = false
	}
	if b.Restorer != 0 && b.withSignal && b.SyscallFn != 0 && len(b.deferred) > 0 {
		if err := b.requeue(ctx); err != nil {
			return 0, fmt.Errorf("call %#x: %w", fn, err)
		}
		if err := setSigmask(tid, BorrowMask); err != nil { // requeue parked it
			return 0, fmt.Errorf("call %#x: signal mask: %w", fn, mapErrno(err))
		}
		b.parked = false
	}
	if b.Restorer != 0 && !b.withSignal {
		sp, ok, err := b.safeFrame()
		if err != nil {
			return 0, fmt.Errorf("call %#x: signal frame: %w", fn, err)
		}
		if ok {
			return b.safeCall(ctx, fn, sp, args)
		}
	}
	b.Created = 0
	r := b.regs
	sp := ((r.Rsp - redZone - callScratch) &^ 15) - 8
	if err := memWrite(t.mem, sp, make([]byte, 8)); err != nil {
		return 0, fmt.Errorf("call %#x: return address: %w", fn, err)
	}
	if err := b.setCallRegs(fn, sp, args); err != nil {
		return 0, err
	}
	if err := unix.PtraceCont(tid, 0); err != nil {
		return 0, fmt.Errorf("call %#x: resume: %w", fn, mapErrno(err))
	}
	b.th.kind = running
	if b.OnResume != nil {
		b.OnResume()
	}
	expired := b.callExpiry(fn)
	for {
		ws, err := t.awaitStop(tid, "during a call", expired)
		if err != nil {
			return 0, err
		}
		wpid := tid
		sig := ws.StopSignal()
		switch event := int(ws) >> 16; {
		case event == unix.PTRACE_EVENT_CLONE:
			if msg, err := unix.PtraceGetEventMsg(tid); err == nil {
				b.Created = int(msg)
			}
			t.handle(wpid, ws) // records the new thread and resumes this one
			b.th.kind = running
		case event == unix.PTRACE_EVENT_EXEC:
			t.handle(wpid, ws)
			return 0, fmt.Errorf("pid %d: %w", t.pid, ErrExec)
		case event == unix.PTRACE_EVENT_STOP && sig != unix.SIGTRAP:
			t.handle(wpid, ws) // group-stop: kept with LISTEN; the call ends after SIGCONT
		case event != 0:
			_ = unix.PtraceCont(tid, 0)
		case sig == unix.SIGSEGV:
			var got Regs
			if err := unix.PtraceGetRegs(tid, &got); err != nil {
				return 0, fmt.Errorf("call %#x: registers: %w", fn, mapErrno(err))
			}
			b.th.kind = stopPlain // the SIGSEGV is never delivered: we resume with 0
			b.sigStop = true
			if got.Rip != callReturnAddr {
				return 0, fmt.Errorf("call %#x on thread %d faulted at %#x: %w", fn, tid, got.Rip, ErrCall)
			}
			return got.Rax, nil
		default:
			// A signal the mask lets through (SIGCANCEL, SIGSETXID) or one
			// that cannot be blocked: keep it for after the restore, so no
			// handler runs on top of our call (a handler that longjmps would
			// never let the call end).
			if si, err := getSiginfo(tid); err == nil {
				b.deferred = append(b.deferred, si)
			}
			_ = unix.PtraceCont(tid, 0)
		}
	}
}

// awaitStop waits for the next ptrace-stop of the borrowed thread tid,
// handing every other task's status to the tracer's event loop (t.handle).
// While nothing is pending it asks expired (nil: keep waiting) and sleeps
// until SIGCHLD or a millisecond. The thread's death ends the wait with
// ErrExited, described as having happened "while" (during a call, while
// parked); so does the end of the whole process.
func (t *Tracer) awaitStop(tid int, while string, expired func() error) (unix.WaitStatus, error) {
	for {
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(-1, &ws, unix.WNOHANG|unix.WALL|unix.WNOTHREAD, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			t.exited = true
			return ws, fmt.Errorf("pid %d: %w", t.pid, ErrExited)
		}
		if wpid == 0 {
			if err := expired(); err != nil {
				return ws, err
			}
			if t.sleepy() {
				continue
			}
			tm := time.NewTimer(time.Millisecond)
			select {
			case <-t.sigchld:
			case <-tm.C:
			}
			tm.Stop()
			continue
		}
		if wpid != tid {
			t.handle(wpid, ws)
			continue
		}
		if ws.Exited() || ws.Signaled() {
			t.handle(wpid, ws)
			return ws, fmt.Errorf("thread %d died %s: %w", tid, while, ErrExited)
		}
		if ws.Stopped() {
			return ws, nil
		}
	}
}

// Park leaves the borrowed thread, between two calls, in a stop from which
// it would resume exactly where it was borrowed if this tracer died: its
// own registers, xstate and signal mask, in an interrupt stop, which
// carries no signal. A call ends in a signal-delivery-stop for the SIGSEGV
// of its return to rip 0; were hotpatch SIGKILLed there, the kernel would
// resume the thread at rip 0 and deliver that SIGSEGV, killing the target
// (docs/injection.md, "SIGKILL of hotpatch during a load"). Park is for
// the slow work between calls (filling the runtime's memfd): the thread
// runs syscall(SYS_pause) (pause, at syscallFn: libc's syscall(), with
// every signal but glibc's two blocked) and is interrupted there, which
// leaves no lock taken. The next Call sets its borrowed mask again.
//
// A thread borrowed with a signal about to be delivered is not parked: that
// signal is injected with its own siginfo only from a signal-delivery-stop.
func (b *Borrowed) Park(ctx context.Context, syscallFn uint64) error {
	t, tid := b.t, b.th.tid
	if err := t.usable(); err != nil {
		return err
	}
	if b.parked || len(b.deferred) > 0 || b.th.kind != stopPlain {
		return nil
	}
	r := b.regs
	sp := ((r.Rsp - redZone - callScratch) &^ 15) - 8
	if err := memWrite(t.mem, sp, make([]byte, 8)); err != nil {
		return fmt.Errorf("park thread %d: %w", tid, err)
	}
	r.Rsp, r.Rip, r.Rax, r.Rdi = sp, syscallFn, 0, unix.SYS_PAUSE
	r.Orig_rax = ^uint64(0)
	r.Eflags &^= eflagsDirection
	if err := unix.PtraceSetRegs(tid, &r); err != nil {
		return fmt.Errorf("park thread %d: set registers: %w", tid, mapErrno(err))
	}
	if err := unix.PtraceCont(tid, 0); err != nil {
		return fmt.Errorf("park thread %d: resume: %w", tid, mapErrno(err))
	}
	b.th.kind = running
	if err := unix.PtraceInterrupt(tid); err != nil {
		return fmt.Errorf("park thread %d: interrupt: %w", tid, mapErrno(err))
	}
	deadline := time.Now().Add(defaultCallLimit)
	for {
		ws, err := t.awaitStop(tid, "while parked", func() error {
			// A SIGSTOP that came first holds the thread in a group-stop
			// (LISTEN) until SIGCONT, which re-traps it with the SIGTRAP
			// event stop we wait for: the limit counts only time it runs.
			if b.th.kind == stopGroup {
				deadline = time.Now().Add(defaultCallLimit)
			} else if time.Now().After(deadline) {
				return fmt.Errorf("park thread %d: no interrupt stop within %v: %w", tid, defaultCallLimit, ErrCall)
			}
			return nil
		})
		if err != nil {
			return err
		}
		wpid := tid
		sig := ws.StopSignal()
		switch event := int(ws) >> 16; {
		case event == unix.PTRACE_EVENT_STOP && sig == unix.SIGTRAP:
			// The interrupt stop: put the thread's own state back.
			return b.restoreOwn()
		case event == unix.PTRACE_EVENT_EXEC:
			t.handle(wpid, ws)
			return fmt.Errorf("pid %d: %w", t.pid, ErrExec)
		case event == unix.PTRACE_EVENT_STOP:
			t.handle(wpid, ws) // group-stop: kept with LISTEN; the interrupt comes after SIGCONT
		case event != 0:
			_ = unix.PtraceCont(tid, 0)
		case sig == unix.SIGSEGV:
			// pause returned (a signal the mask lets through ran its
			// handler) into our return address 0 before the interrupt
			// trapped: not a signal of the program's. Pause again.
			if err := unix.PtraceSetRegs(tid, &r); err != nil {
				return fmt.Errorf("park thread %d: set registers: %w", tid, mapErrno(err))
			}
			_ = unix.PtraceCont(tid, 0)
			_ = unix.PtraceInterrupt(tid)
		default:
			// A signal the mask lets through: kept for after the restore,
			// as during a call. Its stop may have cleared our interrupt
			// (a trap clears a pending one): queued again.
			if si, err := getSiginfo(tid); err == nil {
				b.deferred = append(b.deferred, si)
			}
			_ = unix.PtraceInterrupt(tid)
			_ = unix.PtraceCont(tid, 0)
		}
	}
}

// abandon stops a call that did not return: the thread is interrupted and
// will be restored to where it was borrowed. Whatever the call had done
// (a lock taken, memory allocated) stays done: the error says so.
func (b *Borrowed) abandon(fn uint64, limit time.Duration) error {
	t, tid := b.t, b.th.tid
	_ = unix.PtraceInterrupt(tid)
	end := time.Now().Add(time.Second)
	for time.Now().Before(end) {
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(tid, &ws, unix.WNOHANG|unix.WALL|unix.WNOTHREAD, nil)
		if err != nil {
			break
		}
		if wpid == tid && ws.Stopped() {
			sig, event := ws.StopSignal(), int(ws)>>16
			switch {
			case sig == unix.SIGTRAP|0x80:
				// A system-call stop of a safe call (PTRACE_SYSCALL): no
				// signal of the program's. Resumed without further such
				// stops, the thread takes the interrupt on its way out of
				// the call (a blocking one is cut short by it). Taken for a
				// signal's, its SIGTRAP was handed to the program at the
				// restore, which killed it. A trap clears a pending
				// interrupt (the kernel's ptrace_stop): queue it again, or
				// the thread would run on through rt_sigreturn into its
				// own code, and the restore would rewind it to where it
				// was borrowed, running that code twice.
				_ = unix.PtraceInterrupt(tid)
				_ = unix.PtraceCont(tid, 0)
				continue
			case event != 0 && event != unix.PTRACE_EVENT_STOP:
				// An event (the call made a thread: clone): recorded (held:
				// handle must not resume this one with the interrupt
				// still to come), then on to the interrupt. Its SIGTRAP,
				// too, is no signal of the program's.
				t.hold = true
				t.handle(tid, ws)
				t.hold = false
				_ = unix.PtraceInterrupt(tid) // cleared by this trap, as above
				_ = unix.PtraceCont(tid, 0)
				continue
			}
			if sig != unix.SIGTRAP || event != unix.PTRACE_EVENT_STOP {
				if si, err := getSiginfo(tid); err == nil && sig != unix.SIGSEGV {
					b.deferred = append(b.deferred, si)
				}
			}
			b.th.kind = stopPlain
			b.sigStop = sig != unix.SIGTRAP || event != unix.PTRACE_EVENT_STOP
			break
		}
		t.pump()
		time.Sleep(100 * time.Microsecond)
	}
	return fmt.Errorf("call %#x on thread %d did not return within %v; the thread was put back where it was, what the call had done stays: %w", fn, tid, limit, ErrCall)
}

// restore writes back the saved registers and xstate and resumes the
// thread, delivering the first deferred signal with its siginfo and
// re-raising the others.
func (b *Borrowed) restore() error {
	t, tid := b.t, b.th.tid
	if t.threads[tid] == nil {
		return fmt.Errorf("thread %d: %w", tid, ErrExited)
	}
	if b.th.kind == running {
		return fmt.Errorf("thread %d could not be stopped to restore it: %w", tid, ErrCall)
	}
	if err := unix.PtraceSetRegs(tid, &b.regs); err != nil {
		return fmt.Errorf("restore thread %d: registers: %w", tid, mapErrno(err))
	}
	if err := setXstate(tid, b.xstate); err != nil {
		return fmt.Errorf("restore thread %d: xstate: %w", tid, mapErrno(err))
	}
	if err := setSigmask(tid, b.sigmask); err != nil {
		return fmt.Errorf("restore thread %d: signal mask: %w", tid, mapErrno(err))
	}
	// A signal can be injected only from a signal-delivery-stop (from an
	// interrupt stop it would be ignored): the first deferred signal goes
	// that way with its own siginfo, any others are raised again.
	sig := 0
	rest := b.deferred
	if len(rest) > 0 && b.sigStop {
		si := rest[0]
		if setSiginfo(tid, &si) == nil {
			sig = int(si.Signo)
			rest = rest[1:]
		}
	}
	for _, more := range rest {
		_ = unix.Tgkill(t.pid, tid, unix.Signal(more.Signo))
	}
	b.th.kind = running
	if err := unix.PtraceCont(tid, sig); err != nil {
		return fmt.Errorf("resume thread %d: %w", tid, mapErrno(err))
	}
	t.pump()
	return nil
}

// setCallRegs gives the borrowed thread its own registers but for a call
// of fn with args (at most six, in registers) and the stack pointer at sp:
// no system call to restart, the direction flag clear (the ABI's entry state).
func (b *Borrowed) setCallRegs(fn, sp uint64, args []uint64) error {
	r := b.regs
	r.Rsp, r.Rip, r.Rax = sp, fn, 0
	r.Orig_rax = ^uint64(0)
	r.Eflags &^= eflagsDirection
	regs := []*uint64{&r.Rdi, &r.Rsi, &r.Rdx, &r.Rcx, &r.R8, &r.R9}
	for i, a := range args {
		*regs[i] = a
	}
	if err := unix.PtraceSetRegs(b.th.tid, &r); err != nil {
		return fmt.Errorf("call %#x: set registers: %w", fn, mapErrno(err))
	}
	return nil
}

// callExpiry is the check a call's wait makes at each look: past b.Limit
// (defaultCallLimit when 0) from now, the call is abandoned (abandon's
// error). A cancelled context is not a reason: a function cut short inside
// libc can leave a lock of the program's held (pthread_create's), so that
// the program's next call of it, or the next load's, waits for ever; the
// call runs to its end and the caller sees the context after it.
func (b *Borrowed) callExpiry(fn uint64) func() error {
	limit := b.Limit
	if limit == 0 {
		limit = defaultCallLimit
	}
	deadline := time.Now().Add(limit)
	return func() error {
		if time.Now().After(deadline) {
			return b.abandon(fn, limit)
		}
		return nil
	}
}

// restoreOwn puts the thread's own state back at its interrupt stop
// (registers, XSAVE area, signal mask): it is parked as it was borrowed.
func (b *Borrowed) restoreOwn() error {
	tid := b.th.tid
	b.th.kind = stopPlain
	b.sigStop = false
	if err := unix.PtraceSetRegs(tid, &b.regs); err != nil {
		return fmt.Errorf("park thread %d: registers: %w", tid, mapErrno(err))
	}
	if err := setXstate(tid, b.xstate); err != nil {
		return fmt.Errorf("park thread %d: xstate: %w", tid, mapErrno(err))
	}
	if err := setSigmask(tid, b.sigmask); err != nil {
		return fmt.Errorf("park thread %d: signal mask: %w", tid, mapErrno(err))
	}
	b.parked = true
	return nil
}
