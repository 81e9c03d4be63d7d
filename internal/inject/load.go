package inject

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/procmaps"
	"github.com/edgeprobe/edgeprobe/internal/ptrace"
)

// Options configure Load.
type Options struct {
	// Runtime is the runtime file's contents. Nil routes only: the process
	// maps a runtime already (Process.Runtime) and some slots still point
	// to glibc (an object dlopened after the load).
	Runtime []byte
	// Tries bounds the stops looking for a thread at a safe point (0: 200).
	Tries int
	// Wait bounds the loading thread's dlopen and stores (0: 10s).
	Wait time.Duration
	// Prefer names a thread (its comm) to borrow whenever it is at a safe
	// point, so tests can make a given thread's system call the one
	// interrupted and restarted ($EDGEPROBE_INJECT_THREAD in hotpatch).
	Prefer string
	// Tracer, when set, is an attached tracer to use (hotpatch's lock is a
	// leader-only attach): Load upgrades it to every thread and leaves it
	// attached. Without it Load attaches and detaches itself.
	Tracer *ptrace.Tracer
	// Direct runs the loader on the borrowed thread itself (dlopen, the
	// constructor and the stores all before it resumes) instead of on a new
	// thread: the alternative docs/decisions.md (D22) measured and did not
	// choose. For measurements only.
	Direct bool
	// KillAt makes the process SIGKILL itself at one step of the load:
	// "CALL:in" once the borrowed thread runs CALL (mmap, memfd_create,
	// mprotect, pthread_create), "CALL:end" once CALL returned; "CALL:cancel"
	// cancels the load's context instead, once the thread runs CALL
	// ($EDGEPROBE_TEST_KILL_AT in hotpatch; tests of what a hotpatch killed
	// mid-load leaves behind).
	KillAt string
}

// Result says what Load did.
type Result struct {
	Loaded   bool          `json:"loaded"`   // the runtime was dlopened now
	Entries  int           `json:"entries"`  // slots the loader stored
	Tid      int           `json:"tid"`      // the borrowed thread
	Syscall  int           `json:"syscall"`  // the system call it was stopped in, -1 if none
	Tries    int           `json:"tries"`    // stops until a safe thread was found
	Borrowed time.Duration `json:"borrowed"` // from the borrow to the thread's resume
	Elapsed  time.Duration `json:"elapsed"`  // attach to the loader thread's end
	Area     uint64        `json:"area"`     // where the loader's code and data are (they stay)
	Threads  int           `json:"threads"`  // threads of the process at the stop
	Fallback string        `json:"fallback,omitempty"`
}

// blocking are the system calls a thread may be borrowed in: waits that
// hold no lock of libc's or the loader's (a thread blocked in futex may be
// waiting for one lock while holding another; mmap, brk, mprotect and
// munmap run inside the allocator with its arena lock held).
var blocking = map[int]bool{
	unix.SYS_READ: true, unix.SYS_READV: true, unix.SYS_PREAD64: true, unix.SYS_POLL: true,
	unix.SYS_PPOLL: true, unix.SYS_SELECT: true, unix.SYS_PSELECT6: true, unix.SYS_NANOSLEEP: true,
	unix.SYS_CLOCK_NANOSLEEP: true, unix.SYS_PAUSE: true, unix.SYS_WAIT4: true, unix.SYS_WAITID: true,
	unix.SYS_EPOLL_WAIT: true, unix.SYS_EPOLL_PWAIT: true, 441 /* epoll_pwait2 */ : true,
	unix.SYS_ACCEPT: true, unix.SYS_ACCEPT4: true, unix.SYS_RECVFROM: true, unix.SYS_RECVMSG: true,
	unix.SYS_RT_SIGSUSPEND: true, unix.SYS_RT_SIGTIMEDWAIT: true, unix.SYS_MSGRCV: true,
}

// Load loads the runtime into p's process (or, with opts.Runtime nil,
// routes the slots p.NeedRouting lists to the runtime it maps) and waits
// for the loader thread to finish. The caller checks the preflight
// refusals first (Preflight); Load repeats them.
func Load(ctx context.Context, p *Process, opts Options) (*Result, error) {
	if err := p.Preflight(); err != nil {
		return nil, err
	}
	entries := p.NeedRouting()
	if opts.Runtime == nil && (p.Runtime == nil || len(entries) == 0) {
		return nil, fmt.Errorf("pid %d: nothing to route", p.Pid)
	}
	if len(entries) > maxEntries {
		return nil, fmt.Errorf("pid %d: %d hook slots, at most %d per load", p.Pid, len(entries), maxEntries)
	}
	for _, e := range entries {
		if e.Addr%8 != 0 {
			return nil, fmt.Errorf("%s: hook slot at %#x is not 8-byte aligned: an 8-byte store there could tear", e.Object, e.Addr)
		}
	}
	if opts.Tries == 0 {
		opts.Tries = 200
	}
	if opts.Wait == 0 {
		opts.Wait = 10 * time.Second
	}
	var values [4]uint64
	if opts.Runtime == nil {
		values = p.runtimeHooks
	}
	start := time.Now()
	tr := opts.Tracer
	detached := tr != nil // a caller's tracer is the caller's to detach
	if tr != nil {
		if err := tr.Upgrade(); err != nil {
			return nil, err
		}
	} else {
		var err error
		if tr, err = ptrace.Attach(p.Pid, ptrace.Options{}); err != nil {
			return nil, err
		}
	}
	defer func() {
		if !detached {
			_ = tr.Detach()
		}
	}()
	res := &Result{Syscall: -1, Loaded: opts.Runtime != nil, Entries: len(entries)}
	rng := rand.New(rand.NewPCG(uint64(start.UnixNano()), uint64(p.Pid)))
	for res.Tries = 1; ; res.Tries++ {
		states, err := tr.StopAll(ctx)
		if err != nil {
			_ = tr.ResumeAll()
			return nil, err
		}
		res.Threads = len(states)
		if allGroupStopped(states) {
			_ = tr.ResumeAll()
			return nil, fmt.Errorf("pid %d is stopped (SIGSTOP, Ctrl-Z): continue it (kill -CONT %d) to load the runtime into it: %w", p.Pid, p.Pid, ErrStopped)
		}
		if st := p.pickThread(states, rng, opts.Prefer); st != nil {
			res.Tid = st.Tid
			if nr, _, in := ptrace.InSyscall(&st.Regs); in {
				res.Syscall = nr
			}
			break
		}
		_ = tr.ResumeAll()
		if res.Tries >= opts.Tries {
			return nil, fmt.Errorf("pid %d: %d stops found every thread in the allocator, the loader or a lock wait: %w", p.Pid, res.Tries, ErrNoSafeThread)
		}
		// Let the threads run a little before the next look.
		tr.Pause(time.Millisecond)
	}
	var data uint64
	err := tr.Borrow(res.Tid, func(b *ptrace.Borrowed) error {
		t0 := time.Now()
		defer func() { res.Borrowed = time.Since(t0) }()
		return p.prepare(ctx, b, opts, entries, values, res, &data)
	})
	var derr error
	if !detached {
		derr = tr.Detach()
		detached = true
	}
	if err != nil {
		return res, err
	}
	if derr != nil {
		return res, derr
	}
	// A caller's tracer is still attached, to every thread: the loader
	// thread's clone (and any thread it makes) stops until that tracer
	// serves its events, which a tracer served inline on the caller's own
	// thread (ptrace.Run) does only when asked: the wait asks it.
	var serving *ptrace.Tracer
	if opts.Tracer != nil {
		serving = tr
	}
	if err := p.await(ctx, data, opts.Wait, serving); err != nil {
		return res, err
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// prepare runs on the borrowed thread: map the loader's area, write it,
// create the memfd and fill it, start the loader thread with every
// signal blocked, restore the thread's signal mask.
func (p *Process) prepare(ctx context.Context, b *ptrace.Borrowed, opts Options, entries []Slot, values [4]uint64, res *Result, dataOut *uint64) error {
	f := p.funcs
	runtime := opts.Runtime
	die := func() { _ = unix.Kill(unix.Getpid(), unix.SIGKILL) }
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	call := func(what string, fn uint64, args ...uint64) (uint64, error) {
		b.OnResume = nil
		switch opts.KillAt {
		case what + ":in":
			b.OnResume = die
		case what + ":cancel": // as a SIGINT to hotpatch would, mid-call
			b.OnResume = cancel
		}
		r, err := b.Call(ctx, fn, args...)
		b.OnResume = nil
		if err != nil {
			return 0, fmt.Errorf("%s in pid %d: %w", what, p.Pid, err)
		}
		if opts.KillAt == what+":end" {
			die()
		}
		return r, nil
	}
	// Each call returns into libc's rt_sigreturn trampoline over a frame of
	// the thread's own state, so a hotpatch killed during a call leaves the
	// thread going on where it was borrowed (D70).
	b.Restorer, b.SyscallFn = p.restorer(b), f["syscall"]
	area, err := call("mmap", f["mmap"], 0, codeSize+dataSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, ^uint64(0), 0)
	if err != nil {
		return err
	}
	if int64(area) < 0 || area == 0 {
		return fmt.Errorf("mmap in pid %d failed (%#x)", p.Pid, area)
	}
	res.Area = area
	unmap := func() { _, _ = b.Call(ctx, f["munmap"], area, codeSize+dataSize) }
	// Between calls the thread waits parked in its own state (D59), so a
	// hotpatch SIGKILLed while it writes the loader or fills the memfd
	// leaves it running as before, not at the fault that ends a call.
	if err := b.Park(ctx, f["syscall"]); err != nil {
		unmap()
		return err
	}
	data := area + codeSize
	*dataOut = data
	block := make([]byte, dataSize)
	le := binary.LittleEndian
	le.PutUint64(block[offDlopen:], f["dlopen"])
	le.PutUint64(block[offDlerror:], f["dlerror"])
	le.PutUint64(block[offDlsym:], f["dlsym"])
	le.PutUint64(block[offDetach:], f["pthread_detach"])
	if opts.Direct {
		le.PutUint64(block[offDetach:], f["pthread_self"]) // the borrowed thread must stay joinable
	}
	le.PutUint64(block[offSelf:], f["pthread_self"])
	le.PutUint64(block[offMemfd:], ^uint64(0))
	le.PutUint64(block[offFlags:], rtldNow|rtldNodelete)
	for i, h := range Hooks {
		copy(block[offNames+32*i:], h)
		le.PutUint64(block[offValues+8*i:], values[i])
	}
	if runtime == nil {
		le.PutUint64(block[offHandle:], 1) // route only: skip dlopen and dlsym
	}
	copy(block[offMemfdName:], memfdName)
	le.PutUint64(block[offCount:], uint64(len(entries)))
	for i, e := range entries {
		o := offEntries + entrySize*i
		le.PutUint64(block[o:], e.Addr)
		le.PutUint64(block[o+8:], uint64(hookIndex(e.Hook)))
		le.PutUint64(block[o+16:], e.Addr&^0xfff)
		le.PutUint64(block[o+24:], uint64(int64(e.prot)))
	}
	if err := b.WriteMem(area, loaderCode); err != nil {
		unmap()
		return err
	}
	fd := -1
	if runtime != nil {
		if err := b.WriteMem(data, block); err != nil {
			unmap()
			return err
		}
		r, err := call("memfd_create", f["syscall"], unix.SYS_MEMFD_CREATE, data+offMemfdName, unix.MFD_CLOEXEC)
		if err != nil {
			unmap()
			return err
		}
		if int64(r) < 0 {
			unmap()
			return fmt.Errorf("memfd_create in pid %d failed: %w", p.Pid, ErrLoad)
		}
		fd = int(r)
		closeFd := func() { _, _ = b.Call(ctx, f["syscall"], unix.SYS_CLOSE, uint64(fd)) }
		if err := b.Park(ctx, f["syscall"]); err != nil {
			closeFd()
			unmap()
			return err
		}
		if err := fillMemfd(p.Pid, fd, runtime); err != nil {
			closeFd()
			unmap()
			return err
		}
		le.PutUint64(block[offMemfd:], uint64(fd))
		copy(block[offPath:], fmt.Sprintf("/proc/thread-self/fd/%d\x00", fd)) // the loader thread's own: /proc/self is the main thread's, which may have exited (D95)
	}
	if err := b.WriteMem(data, block); err != nil {
		unmap()
		return err
	}
	if r, err := call("mprotect", f["mprotect"], area, codeSize, unix.PROT_READ|unix.PROT_EXEC); err != nil || r != 0 {
		unmap()
		if err != nil {
			return err // names the call and the pid already
		}
		return fmt.Errorf("mprotect in pid %d returned %d: %w", p.Pid, int64(r), ErrLoad)
	}
	if opts.Direct {
		b.Limit = opts.Wait
		_, err := call("the loader", area, data)
		return err
	}
	// The borrowed thread runs with ptrace.BorrowMask, which the loader
	// thread inherits from it.
	rc, err := call("pthread_create", f["pthread_create"], data+offThread, 0, area, data)
	if err == nil && b.Restorer != 0 {
		// The result is that of pthread_create's last system call, not
		// its own: whether it made a thread says it.
		rc = 0
		if b.Created == 0 {
			rc = uint64(unix.EAGAIN)
		}
	}
	if err == nil && rc != 0 {
		err = fmt.Errorf("pthread_create in pid %d: %v: %w", p.Pid, unix.Errno(rc), ErrLoad)
		if fd >= 0 {
			_, _ = b.Call(ctx, f["syscall"], unix.SYS_CLOSE, uint64(fd))
		}
		unmap()
	}
	return err
}

// restorer returns the address of an rt_sigreturn trampoline
// (ptrace.RestorerCode) in libc's executable mappings, 0 if there is none
// (calls then return into address 0, as before D70).
func (p *Process) restorer(b *ptrace.Borrowed) uint64 {
	if p.Libc == nil {
		return 0
	}
	for _, r := range p.Libc.Exec {
		if r.End <= r.Start || r.End-r.Start > 64<<20 {
			continue
		}
		text := make([]byte, r.End-r.Start)
		if b.ReadMem(r.Start, text) != nil {
			continue
		}
		if i := bytes.Index(text, ptrace.RestorerCode); i >= 0 {
			return r.Start + uint64(i)
		}
	}
	return 0
}

// await polls the loader thread's done word and returns dlopen's error, if
// any. tr, when not nil, is a tracer still attached to the process: it
// serves the process's events between the polls (Tracer.Pause).
func (p *Process) await(ctx context.Context, data uint64, limit time.Duration, tr *ptrace.Tracer) error {
	mem, err := ptrace.OpenMem(p.Pid)
	if err != nil {
		return err
	}
	defer mem.Close()
	deadline := time.Now().Add(limit)
	var w [8]byte
	for {
		if err := mem.ReadMem(data+offDone, w[:4]); err != nil {
			return err
		}
		if binary.LittleEndian.Uint32(w[:4]) == 1 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d: the loader thread did not finish within %v (it goes on; hotpatch will see its result next time): %w", p.Pid, limit, ErrLoad)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if tr != nil {
			tr.Pause(200 * time.Microsecond)
		} else {
			time.Sleep(200 * time.Microsecond)
		}
	}
	if err := mem.ReadMem(data+offHandle, w[:]); err != nil {
		return err
	}
	if binary.LittleEndian.Uint64(w[:]) != 0 {
		return nil
	}
	// dlerror's message as the loader copied it into the data block: the
	// string dlerror returned was in the loader thread's own buffer, which
	// glibc frees when the thread exits (read there, it came back empty).
	msg := "dlopen failed"
	if err := mem.ReadMem(data+offError, w[:]); err == nil && binary.LittleEndian.Uint64(w[:]) != 0 {
		buf := make([]byte, 256)
		if err := mem.ReadMem(data+offMessage, buf); err == nil {
			if i := bytes.IndexByte(buf, 0); i >= 0 {
				buf = buf[:i]
			}
			if len(buf) > 0 {
				msg = "dlopen: " + calltrace.Printable(string(buf))
			}
		}
	}
	return fmt.Errorf("pid %d: %s: %w", p.Pid, msg, ErrLoad)
}

// pickThread chooses the thread to borrow: one blocked in a plain waiting
// system call (it holds no libc or loader lock, and its call restarts), else
// one running the program's own code (outside libc, libpthread, libdl and
// ld.so, so not inside the allocator or the loader). Ties are broken at
// random. Nil: none is safe at this stop.
func (p *Process) pickThread(states []ptrace.ThreadState, rng *rand.Rand, prefer string) *ptrace.ThreadState {
	var system []*procmaps.Object
	for i := range p.Objects {
		o := &p.Objects[i]
		base := path.Base(o.Path)
		if o == p.Libc || o == p.Loader || strings.HasPrefix(base, "libpthread") || strings.HasPrefix(base, "libdl") {
			system = append(system, o)
		}
	}
	var idle, busy []*ptrace.ThreadState
	for i := range states {
		st := &states[i]
		pc := st.Regs.Rip
		if p.Loader != nil && p.Loader.InExec(pc, 1) {
			continue
		}
		inSystem := false
		for _, o := range system {
			if o.InExec(pc, 1) {
				inSystem = true
			}
		}
		nr, _, in := ptrace.InSyscall(&st.Regs)
		switch {
		case in && blocking[nr]:
			idle = append(idle, st)
		case !in && !inSystem:
			busy = append(busy, st)
		}
	}
	if prefer != "" {
		for _, st := range append(idle, busy...) {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/comm", p.Pid, st.Tid))
			if strings.TrimSpace(string(comm)) == prefer {
				return st
			}
		}
		return nil // not at a safe point now: look again
	}
	if len(idle) > 0 {
		return idle[rng.IntN(len(idle))]
	}
	if len(busy) > 0 {
		return busy[rng.IntN(len(busy))]
	}
	return nil
}

// Preflight returns the refusal that applies to p, if any: nothing is
// changed by it.
func (p *Process) Preflight() error {
	if !p.statusRead {
		status, err := procfs.ReadStatus(p.Pid, 0)
		if err != nil {
			return err
		}
		p.Seccomp = max(status.Int("Seccomp"), 0)
		if uid := strings.Fields(status["Uid"]); len(uid) > 0 {
			p.UID, _ = strconv.Atoi(uid[0]) // the real uid, the first of four
		}
		p.statusRead = true
	}
	if !p.threadsCounted {
		p.SeccompThreads, p.threadsCounted = procfs.SeccompThreads(p.Pid), true
	}
	switch {
	case p.Seccomp != 0:
		return fmt.Errorf("pid %d runs under seccomp (mode %d): loading the runtime could get it killed; start it with LD_PRELOAD=libedgeprobe.so instead: %w", p.Pid, p.Seccomp, ErrSeccomp)
	case p.SeccompThreads != 0:
		return fmt.Errorf("pid %d: %d of its threads run under seccomp: loading the runtime could get it killed; start it with LD_PRELOAD=libedgeprobe.so instead: %w", p.Pid, p.SeccompThreads, ErrSeccomp)
	case p.Static:
		return fmt.Errorf("pid %d is statically linked: no loader to load the runtime with; link libedgeprobe.a into it (-Wl,--whole-archive libedgeprobe.a -Wl,--no-whole-archive): %w", p.Pid, ErrStatic)
	}
	var missing []string
	for _, n := range libcFuncs {
		if n == "dlerror" {
			continue
		}
		if p.funcs[n] == 0 {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("pid %d: %s not found in libc, libdl or libpthread (glibc before 2.34 needs libdl and libpthread mapped; start it with LD_PRELOAD=libedgeprobe.so instead): %w", p.Pid, strings.Join(missing, ", "), ErrNoLoader)
	}
	return nil
}

// allGroupStopped: every thread is in a group-stop (the process is
// stopped), so none can be borrowed without continuing it.
func allGroupStopped(states []ptrace.ThreadState) bool {
	for _, st := range states {
		if !st.Group {
			return false
		}
	}
	return len(states) > 0
}

// IsRefusal reports whether err is one of the preflight refusals.
func IsRefusal(err error) bool {
	for _, e := range []error{ErrSeccomp, ErrStatic, ErrNoLoader, ErrUntrusted, ErrNotRuntime, ErrStopped} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
