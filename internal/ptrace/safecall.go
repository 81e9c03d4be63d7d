package ptrace

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// A call made with a Restorer (see Borrowed.Restorer) returns into the
// target's own rt_sigreturn trampoline over a signal frame that holds the
// thread's state as it was borrowed, instead of into address 0: if hotpatch
// dies (SIGKILL, OOM) while the thread runs the call or sits in one of its
// stops, the kernel lets the thread go, the call returns, and rt_sigreturn
// puts back its registers, signal mask and extended state, so it goes on
// where it was borrowed, as after a signal handler (docs/injection.md,
// "SIGKILL of hotpatch during a load"). While we are alive the thread runs
// with PTRACE_SYSCALL: the entry stop of that rt_sigreturn ends the call;
// the rt_sigreturn is skipped and the thread goes into an interrupt stop
// with its own state (parked), as Park leaves it.
const (
	fxswOffset   = 464        // struct _fpx_sw_bytes in the FXSAVE area's sw_reserved
	fpxMagic1    = 0x46505853 // FP_XSTATE_MAGIC1
	fpxMagic2    = 0x46505845 // FP_XSTATE_MAGIC2, after the XSAVE area in a signal frame
	ucFpXstate   = 1          // UC_FP_XSTATE
	ucontextSize = 8 + 8 + 24 + 256 + 8
	sigcontextAt = 40 // uc_mcontext in struct ucontext
	sigmaskAt    = sigcontextAt + 256
	sysSigreturn = 15 // rt_sigreturn
	restorerLen  = 9  // mov $15,%rax; syscall
	siginfoSize  = 128
)

// RestorerCode is an x86-64 rt_sigreturn trampoline (glibc's __restore_rt):
// mov $15,%rax; syscall.
var RestorerCode = []byte{0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05}

// resumeRegs are the registers the thread must have to go on as if it had
// never been stopped, for code that resumes it without the kernel's
// system-call restart (rt_sigreturn clears orig_rax): an interrupted
// system call whose rax asks for a restart is issued again, its arguments
// being still in place. For -ERESTART_RESTARTBLOCK (nanosleep, poll or a
// futex wait with a timeout) that is the whole call again, not the kernel's
// restart_syscall with the time left (rt_sigreturn disarms that, and it
// would return EINTR): the wait may last longer than asked, never shorter,
// and no error shows.
func resumeRegs(r Regs) Regs {
	if nr, restart, in := InSyscall(&r); in && restart {
		r.Rax = uint64(nr)
		r.Rip -= 2 // the syscall instruction
	}
	r.Orig_rax = ^uint64(0)
	return r
}

// safeFrame writes, below the thread's red zone, the signal frame
// rt_sigreturn restores the borrowed state from, and returns where the
// call's return address goes (the frame's pretcode slot, 8 mod 16 as at a
// function's entry). ok is false when the xstate carries no signal-frame
// description (no XSAVE): the caller then calls the old way.
func (b *Borrowed) safeFrame() (sp uint64, ok bool, err error) {
	return b.safeFrameBelow(b.sigAddr())
}

// sigAddr is where requeue writes a siginfo: just below the red zone, above
// the frame.
func (b *Borrowed) sigAddr() uint64 {
	return (b.regs.Rsp - redZone - callScratch - siginfoSize) &^ 15
}

// safeFrameBelow is safeFrame with the frame below top.
func (b *Borrowed) safeFrameBelow(top uint64) (sp uint64, ok bool, err error) {
	// The regset holds the XSAVE area in its standard form, with XCR0 (the
	// enabled feature mask) in the first word of sw_reserved, where a
	// signal frame has its struct _fpx_sw_bytes (magic1, extended_size,
	// xfeatures, xstate_size) and FP_XSTATE_MAGIC2 after the area.
	xs := b.xstate
	if len(xs) < 576 || len(xs)%64 != 0 {
		return 0, false, nil // no XSAVE header: legacy FXSAVE only
	}
	le := binary.LittleEndian
	xcr0 := le.Uint64(xs[fxswOffset:])
	if xcr0&3 != 3 {
		return 0, false, nil
	}
	size := uint64(len(xs))
	fp := (top - size - 4) &^ 63 // XRSTOR wants 64-byte alignment
	fpbuf := make([]byte, size+4)
	copy(fpbuf, xs)
	sw := fpbuf[fxswOffset : fxswOffset+48]
	clear(sw)
	le.PutUint32(sw[0:], fpxMagic1)
	le.PutUint32(sw[4:], uint32(size+4))
	le.PutUint64(sw[8:], xcr0)
	le.PutUint32(sw[16:], uint32(size))
	le.PutUint32(fpbuf[size:], fpxMagic2)
	uc := (fp - ucontextSize) &^ 15
	ucb := make([]byte, ucontextSize)
	le.PutUint64(ucb[0:], ucFpXstate)
	// uc_stack: rt_sigreturn hands it to sigaltstack and ignores every
	// error but EFAULT; flags 3 (no valid mode) is refused with EINVAL
	// before anything changes, so the thread keeps its alternate stack.
	le.PutUint32(ucb[16+8:], 3)
	r := resumeRegs(b.regs)
	sc := ucb[sigcontextAt:]
	for i, v := range []uint64{r.R8, r.R9, r.R10, r.R11, r.R12, r.R13, r.R14, r.R15, r.Rdi, r.Rsi, r.Rbp, r.Rbx, r.Rdx, r.Rax, r.Rcx, r.Rsp, r.Rip, r.Eflags} {
		le.PutUint64(sc[8*i:], v)
	}
	le.PutUint16(sc[144:], uint16(r.Cs))
	le.PutUint16(sc[150:], uint16(r.Ss))
	le.PutUint64(sc[184:], fp) // fpstate
	le.PutUint64(ucb[sigmaskAt:], b.sigmask)
	if err := memWrite(b.t.mem, fp, fpbuf); err != nil {
		return 0, false, err
	}
	if err := memWrite(b.t.mem, uc, ucb); err != nil {
		return 0, false, err
	}
	ret := make([]byte, 8)
	le.PutUint64(ret, b.Restorer)
	if err := memWrite(b.t.mem, uc-8, ret); err != nil {
		return 0, false, err
	}
	return uc - 8, true, nil
}

// safeCall is Call with a Restorer (see there). It returns the result of
// the last system call the function made (rax itself is gone: the
// trampoline loads the rt_sigreturn number into it).
func (b *Borrowed) safeCall(ctx context.Context, fn uint64, sp uint64, args []uint64) (uint64, error) {
	t, tid := b.t, b.th.tid
	if err := b.setCallRegs(fn, sp, args); err != nil {
		return 0, err
	}
	if err := unix.PtraceSyscall(tid, 0); err != nil {
		return 0, fmt.Errorf("call %#x: resume: %w", fn, mapErrno(err))
	}
	b.th.kind = running
	b.Created = 0
	if b.OnResume != nil {
		b.OnResume()
	}
	expired := b.callExpiry(fn)
	var last uint64
	cont := func() { _ = unix.PtraceSyscall(tid, 0) }
	for {
		ws, err := t.awaitStop(tid, "during a call", expired)
		if err != nil {
			return 0, err
		}
		sig := ws.StopSignal()
		switch event := int(ws) >> 16; {
		case sig == unix.SIGTRAP|0x80:
			var got Regs
			if err := unix.PtraceGetRegs(tid, &got); err != nil {
				return 0, fmt.Errorf("call %#x: registers: %w", fn, mapErrno(err))
			}
			op, err := syscallStopOp(tid)
			if err != nil {
				// Before Linux 5.3 (no PTRACE_GET_SYSCALL_INFO): an entry
				// stop shows rax -ENOSYS.
				op = syscallInfoExit
				if -int64(got.Rax) == int64(unix.ENOSYS) {
					op = syscallInfoEntry
				}
			}
			if op == syscallInfoExit {
				last = got.Rax
			}
			if op == syscallInfoEntry && got.Orig_rax == sysSigreturn && got.Rip == b.Restorer+restorerLen && got.Rsp == sp+8 {
				// The function returned into the trampoline.
				return last, b.parkAfterCall(fn)
			}
			cont()
		case event == unix.PTRACE_EVENT_CLONE:
			// Record the new thread without letting handle resume this
			// one with PTRACE_CONT (it would run the trampoline).
			if msg, err := unix.PtraceGetEventMsg(tid); err == nil {
				b.Created = int(msg)
			}
			t.hold = true
			t.handle(tid, ws)
			t.hold = false
			b.th.kind = running
			cont()
		case event == unix.PTRACE_EVENT_EXEC:
			t.handle(tid, ws)
			return 0, fmt.Errorf("pid %d: %w", t.pid, ErrExec)
		case event == unix.PTRACE_EVENT_STOP && sig != unix.SIGTRAP:
			t.handle(tid, ws) // group-stop: kept with LISTEN; re-traps after SIGCONT
		case event != 0:
			cont()
		case sig == unix.SIGSEGV || sig == unix.SIGBUS || sig == unix.SIGILL || sig == unix.SIGFPE:
			var got Regs
			_ = unix.PtraceGetRegs(tid, &got)
			b.th.kind = stopPlain // never delivered: restore resumes it with 0
			b.sigStop = true
			return 0, fmt.Errorf("call %#x on thread %d faulted at %#x (%v): %w", fn, tid, got.Rip, sig, ErrCall)
		default:
			// A signal the mask lets through (SIGCANCEL, SIGSETXID) or one
			// that cannot be blocked: kept for after the restore.
			if si, err := getSiginfo(tid); err == nil {
				b.deferred = append(b.deferred, si)
			}
			cont()
		}
	}
}

// parkAfterCall takes the thread from the entry stop of the trampoline's
// rt_sigreturn to an interrupt stop with its own state: the rt_sigreturn
// is skipped (orig_rax -1) with the registers it would have restored, an
// interrupt is queued, and in that interrupt stop (inside the kernel's
// signal path, where an interrupted system call's restart still applies)
// the registers as borrowed, the xstate and the signal mask go back: the
// state Park leaves. Killed at any point of this, we leave the thread
// resuming where it was borrowed.
func (b *Borrowed) parkAfterCall(fn uint64) error {
	t, tid := b.t, b.th.tid
	r := resumeRegs(b.regs)
	if err := unix.PtraceSetRegs(tid, &r); err != nil {
		return fmt.Errorf("call %#x: skip the return: %w", fn, mapErrno(err))
	}
	if err := unix.PtraceInterrupt(tid); err != nil {
		return fmt.Errorf("call %#x: interrupt: %w", fn, mapErrno(err))
	}
	if err := unix.PtraceCont(tid, 0); err != nil {
		return fmt.Errorf("call %#x: resume: %w", fn, mapErrno(err))
	}
	deadline := time.Now().Add(defaultCallLimit)
	for {
		ws, err := t.awaitStop(tid, "after a call", func() error {
			if b.th.kind == stopGroup {
				deadline = time.Now().Add(defaultCallLimit)
			} else if time.Now().After(deadline) {
				return fmt.Errorf("call %#x: thread %d: no interrupt stop within %v: %w", fn, tid, defaultCallLimit, ErrCall)
			}
			return nil
		})
		if err != nil {
			return err
		}
		sig := ws.StopSignal()
		switch event := int(ws) >> 16; {
		case event == unix.PTRACE_EVENT_STOP && sig == unix.SIGTRAP:
			return b.restoreOwn()
		case event == unix.PTRACE_EVENT_EXEC:
			t.handle(tid, ws)
			return fmt.Errorf("pid %d: %w", t.pid, ErrExec)
		case event == unix.PTRACE_EVENT_STOP:
			t.handle(tid, ws) // group-stop: the interrupt comes after SIGCONT
		case event != 0:
			_ = unix.PtraceCont(tid, 0)
		default:
			// A signal the mask lets through, on the way out: kept for
			// after the restore. Its stop cleared our pending interrupt
			// (a trap does), which is queued again.
			if si, err := getSiginfo(tid); err == nil {
				b.deferred = append(b.deferred, si)
			}
			_ = unix.PtraceInterrupt(tid)
			_ = unix.PtraceCont(tid, 0)
		}
	}
}

// requeue puts the signal the thread was borrowed with (its
// signal-delivery-stop had taken it from the queue) back into the thread's
// queue, with its own siginfo, by having the thread send it to itself
// (rt_tgsigqueueinfo through libc's syscall(), a safe call): blocked by the
// borrowed mask, it stays pending and is delivered once the thread's own
// mask is back, whether by our restore or by the rt_sigreturn of a call
// that outlived us. Only from the target itself may a siginfo the kernel
// made (si_code >= 0, SI_TKILL) be queued again. Safe calls are then
// possible for such a thread too. The one window: a tracer killed between
// the resume that drops the stop's signal and the thread's system call
// loses that signal (the call is the first thing the thread runs).
func (b *Borrowed) requeue(ctx context.Context) error {
	si := b.deferred[0]
	at := b.sigAddr()
	if err := memWrite(b.t.mem, at, si.bytes()); err != nil {
		return fmt.Errorf("requeue signal %d: %w", si.Signo, err)
	}
	sp, ok, err := b.safeFrameBelow(at)
	if err != nil || !ok {
		return err
	}
	hook := b.OnResume // the test hook is for the caller's call
	b.OnResume = nil
	defer func() { b.OnResume = hook }()
	rc, err := b.safeCall(ctx, b.SyscallFn, sp, []uint64{unix.SYS_RT_TGSIGQUEUEINFO, uint64(b.t.pid), uint64(b.th.tid), uint64(si.Signo), at})
	if err != nil {
		return err
	}
	if rc == 0 {
		b.deferred = b.deferred[1:]
	}
	// Parked now, in an interrupt stop: nothing can be injected any more;
	// a signal still deferred is raised again at the restore.
	b.withSignal = false
	return nil
}
