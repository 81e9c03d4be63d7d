package ptrace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
)

// Options configure Attach.
type Options struct {
	// LeaderOnly seizes only the thread-group leader and traces no clones:
	// enough to make /proc/PID/mem writes legal on kernels booted with
	// proc_mem.force_override=ptrace (the flip protocol needs nothing more),
	// but StopAll, Sync and trap addresses are unavailable.
	LeaderOnly bool
	// StopTimeout bounds how long StopAll, Sync and Detach wait for every
	// thread to report a stop (a thread in uninterruptible sleep reports only
	// when it wakes). Zero means 5s.
	StopTimeout time.Duration
	// Process is the process's pid when the thread attached is not its
	// leader (its main thread has exited: hotpatch works through another
	// thread, D95); 0 otherwise. An exec by another thread is then
	// reported under this pid.
	Process int
	// KillAtTrap (tests only) makes the calling process SIGKILL itself
	// right after it reaped a SIGTRAP signal-delivery-stop while a trap is
	// armed, before it handles the stop: a tracer killed in the window
	// prewind exists for (TestKilledAfterTrapReaped).
	KillAtTrap bool
}

// Stats counts what the event loop has seen since Attach.
type Stats struct {
	Threads    int    // threads currently tracked
	Clones     uint64 // threads born while attached
	Signals    uint64 // signal-delivery-stops re-injected unchanged
	GroupStops uint64 // group-stops kept with PTRACE_LISTEN
	TrapsHeld  uint64 // threads held at an armed int3
	StaleTraps uint64 // threads that hit an int3 already removed, rewound
	Prewound   uint64 // SIGTRAP stops rewound to the site before they were reaped (prewind)
	Syncs      uint64 // Sync rounds completed
	Forks      uint64 // children forked while attached, repaired and detached before they ran
	Vforks     uint64 // vfork children, traced like threads (they share our text) until exec or exit
	Repaired   uint64 // sites rewritten in forked children (they held an int3 of a batch in flight)
}

// Regs is a stopped thread's registers.
type Regs = unix.PtraceRegs

// ThreadState is one thread of a stopped process.
type ThreadState struct {
	Tid  int
	Regs Regs
	// Group: the thread is in a group-stop (the process was stopped by
	// SIGSTOP or Ctrl-Z); it cannot be borrowed.
	Group bool
}

type stopKind int

const (
	running        stopKind = iota // not in a ptrace-stop known to us
	stopPlain                      // interrupt-stop, new-thread stop, event stop: resume with nothing to deliver
	stopGroup                      // group-stop: resume with PTRACE_LISTEN
	stopSignal                     // signal-delivery-stop: resume re-injecting sig
	stopTrap                       // held at an armed int3 (PC = addr+1)
	stopSuppressed                 // a stale int3 already rewound: resume with no signal
)

type thread struct {
	tid       int
	announced bool // its clone event was seen (or it was seized at attach)
	kind      stopKind
	sig       int
	syncWant  bool // Sync waits for this thread to pass through a stop
	trapAt    uint64
	// moving: the thread trapped at an armed site, was rewound to the site
	// and resumed with an interrupt pending; its interrupt-stop is where it
	// is held (see isOurTrap).
	moving bool
	// inVfork: the thread is blocked in vfork until its child execs or
	// exits; it is in the kernel, so Sync counts it as synced.
	inVfork bool
	// prewound: its SIGTRAP stop, still unreaped, was found at an address
	// we armed and its PC already set back to the site (prewind); the stop
	// is handled as such once reaped.
	prewound bool
}

// Kinds of child a traced thread may create, from its ptrace event.
const (
	kidFork  = unix.PTRACE_EVENT_FORK
	kidVfork = unix.PTRACE_EVENT_VFORK
)

type trap struct {
	armed bool
	held  []int
}

// Tracer traces one process from one locked OS thread.
type Tracer struct {
	pid  int
	opts Options
	reqs chan func()
	done chan struct{} // closed when the server goroutine returns
	tid  int           // the tracer OS thread
	// inline: served on a Run thread by the goroutine that attached (no
	// server goroutine: reqs and done are unused).
	inline bool
	// chldOn: sigchld receives SIGCHLD (from the start for a tracer
	// goroutine; an inline tracer's first sleep registers it: sleepy).
	chldOn bool
	// pidfd is the tracer thread's pidfd (PIDFD_THREAD), readable once the
	// thread has exited, or -1; awaitRelease waits on it. Not the
	// tracer's own for an inline tracer: Run's, which Run closes.
	pidfd int

	// depth counts the requests running (inline: pump before the outermost).
	depth int

	// Everything below is touched only on the tracer thread.
	mem      int
	threads  map[int]*thread
	unborn   map[int]bool // exited before its creator's clone event was seen
	traps    map[uint64]*trap
	hold     bool // keep every thread stopped (StopAll .. ResumeAll)
	exited   bool
	execed   bool
	detached bool
	// kids are children announced by a fork or vfork event whose first stop
	// has not been handled yet; early holds children whose first stop came
	// before their parent's event (they stay stopped until it does).
	kids  map[int]int
	early map[int]bool
	// forkForms holds, per armed-once address, the whole form a forked
	// child gets there if it inherited an int3 (see ForkForm).
	forkForms map[uint64][]byte
	sigchld   chan os.Signal
	stats     Stats
}

// Attach seizes every thread of pid and returns its tracer. The process is
// not stopped. Threads created while the seize loop runs are caught either by
// a rescan of /proc/PID/task or, once their creator is seized, as clone events.
func Attach(pid int, opts Options) (*Tracer, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("attach to pid %d: %w", pid, ErrNoProcess)
	}
	if opts.StopTimeout == 0 {
		opts.StopTimeout = 5 * time.Second
	}
	t := &Tracer{
		pid:     pid,
		opts:    opts,
		reqs:    make(chan func()),
		done:    make(chan struct{}),
		mem:     -1,
		pidfd:   -1,
		threads: map[int]*thread{},
		unborn:  map[int]bool{},
		traps:   map[uint64]*trap{},
		sigchld: make(chan os.Signal, 1),

		kids:      map[int]int{},
		early:     map[int]bool{},
		forkForms: map[uint64][]byte{},
	}
	if rt := claimInline(t); rt != nil {
		if err := t.attachInline(rt); err != nil {
			return nil, err
		}
		return t, nil
	}
	ready := make(chan error, 1)
	go t.serve(ready)
	if err := <-ready; err != nil {
		<-t.done
		if t.pidfd >= 0 {
			unix.Close(t.pidfd)
		}
		return nil, err
	}
	return t, nil
}

// threadPidfd opens a pidfd of thread tid (Linux 6.9), or returns -1.
func threadPidfd(tid int) int {
	fd, err := unix.PidfdOpen(tid, unix.PIDFD_THREAD)
	if err != nil {
		return -1
	}
	return fd
}

func (t *Tracer) notifyChld() {
	if !t.chldOn {
		signal.Notify(t.sigchld, unix.SIGCHLD)
		t.chldOn = true
	}
}

func (t *Tracer) stopChld() {
	if t.chldOn {
		signal.Stop(t.sigchld)
		t.chldOn = false
	}
}

// sleepy makes sure SIGCHLD wakes the tracer's sleeps, before a wait
// sleeps for the first time: a tracer served inline registers for it only
// then, since each registration and its removal is a round trip to the Go
// runtime's signal-mask thread (two locked threads: a few context switches
// each way) that a request which never sleeps (a flip) need not pay.
// It reports whether it registered now: the caller then looks for events
// once more before it sleeps, so none that came before is waited for.
func (t *Tracer) sleepy() bool {
	if t.chldOn {
		return false
	}
	t.notifyChld()
	return true
}

// Pid is the traced process.
func (t *Tracer) Pid() int { return t.pid }

func (t *Tracer) serve(ready chan<- error) {
	// The goroutine keeps its OS thread locked until it returns, so the
	// thread exits with it and the kernel detaches anything still traced.
	if !lockThread() {
		go t.serve(ready) // the main thread: not this one
		return
	}
	defer close(t.done)
	t.tid = unix.Gettid()
	t.pidfd = threadPidfd(t.tid)
	t.notifyChld()
	if err := t.attach(); err != nil {
		t.stopChld()
		t.cleanup()
		ready <- err
		return
	}
	ready <- nil
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !t.detached {
		t.pump()
		select {
		case fn := <-t.reqs:
			fn()
		case <-t.sigchld:
		case <-tick.C:
		}
	}
	t.stopChld()
}

// fullOptions are the ptrace options of a tracer of every thread. Forks and
// vforks are followed so that no child runs with an int3 of a batch in
// flight (it would die of SIGTRAP, having no tracer): a forked child is
// repaired before it runs, a vfork child (which shares the text) is traced
// like a thread until it execs or exits.
// TRACESYSGOOD marks the system-call stops a call with a Restorer runs
// through (SIGTRAP|0x80), so that none is taken for a signal.
const fullOptions = unix.PTRACE_O_TRACECLONE | unix.PTRACE_O_TRACEEXEC |
	unix.PTRACE_O_TRACEFORK | unix.PTRACE_O_TRACEVFORK | unix.PTRACE_O_TRACEVFORKDONE |
	unix.PTRACE_O_TRACESYSGOOD

// Upgrade makes a LeaderOnly tracer trace every thread, as Attach without
// LeaderOnly would have, without ever letting go of the leader: a caller
// that uses the attach as its lock on the process (hotpatch does) keeps it
// throughout. The leader is interrupted once (PTRACE_SETOPTIONS needs a
// ptrace-stop) and resumed; no other thread is stopped.
func (t *Tracer) Upgrade() error {
	return t.Do(func() error {
		if !t.opts.LeaderOnly {
			return nil
		}
		if err := t.usable(); err != nil {
			return err
		}
		t.hold = true
		defer func() {
			t.hold = false
			for _, th := range t.threads {
				if th.kind != stopTrap {
					t.resume(th)
				}
			}
		}()
		t.pump()
		leader := t.threads[t.pid]
		if leader == nil {
			return fmt.Errorf("pid %d: %w", t.pid, ErrExited)
		}
		if leader.kind == running && procfs.LeaderExited(t.pid) {
			// The leader exited after we seized it (pthread_exit in main)
			// and the process runs on: a zombie never stops, and it stays
			// traced by us (the caller's lock: its TracerPid names us)
			// until this thread exits. Every other thread is seized with
			// the full options; the zombie is no longer one we stop,
			// resume or detach (D95).
			delete(t.threads, t.pid)
			t.opts.LeaderOnly = false
			if err := t.seizeAll(fullOptions, time.Now().Add(t.opts.StopTimeout)); err != nil {
				return err
			}
			return t.seizeVforkChildren()
		}
		if leader.kind == running {
			if err := unix.PtraceInterrupt(t.pid); err != nil {
				return fmt.Errorf("upgrade: interrupt pid %d: %w", t.pid, mapErrno(err))
			}
		}
		if err := t.waitFor(context.Background(), t.opts.StopTimeout, "the leader to stop", func() bool {
			return leader.kind != running
		}); err != nil {
			return err
		}
		if err := unix.PtraceSetOptions(t.pid, fullOptions); err != nil {
			return fmt.Errorf("upgrade: set options on pid %d: %w", t.pid, mapErrno(err))
		}
		t.opts.LeaderOnly = false
		if err := t.seizeAll(fullOptions, time.Now().Add(t.opts.StopTimeout)); err != nil {
			return err
		}
		return t.seizeVforkChildren()
	})
}

func (t *Tracer) attach() error {
	options := uintptr(fullOptions)
	if t.opts.LeaderOnly {
		options = unix.PTRACE_O_TRACEEXEC
	}
	if err := seize(t.pid, options); err != nil {
		return attachErr(t.pid, err)
	}
	t.threads[t.pid] = &thread{tid: t.pid, announced: true}
	if !t.opts.LeaderOnly {
		if err := t.seizeAll(options); err != nil {
			return err
		}
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/mem", t.pid), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /proc/%d/mem: %w", t.pid, mapErrno(err))
	}
	t.mem = fd
	if !t.opts.LeaderOnly {
		return t.seizeVforkChildren()
	}
	return nil
}

// seizeAll seizes every thread in /proc/PID/task, rescanning until a scan
// finds nothing new: a thread cloned by a thread we had not seized yet is
// untraced and shows up in the next scan; one cloned by a seized thread is
// auto-attached (seizing it again fails with EPERM; its TracerPid is us).
//
// Until patient, a thread still traced by another tracer is waited for
// (Upgrade: we hold the leader, so that tracer is one letting go).
func (t *Tracer) seizeAll(options uintptr, patient ...time.Time) error {
	waited := 0 // a thread whose other tracer we waited for in the last scan
	for round := 0; ; round++ {
		if round >= 1000 && (len(patient) == 0 || time.Now().After(patient[0])) {
			if waited != 0 && tracerOf(waited) > 0 {
				// Its tracer did not let go: name it (review8), not
				// the thread list.
				return attachErr(waited, unix.EPERM)
			}
			return fmt.Errorf("attach to pid %d: thread list did not settle after %d scans", t.pid, round)
		}
		waited = 0
		tids, err := listThreads(t.pid)
		if err != nil {
			return err
		}
		fresh := 0
		for _, tid := range tids {
			if _, ok := t.threads[tid]; ok {
				continue
			}
			err := seize(tid, options)
			switch {
			case err == nil:
			case err == unix.ESRCH:
				continue // exited between the scan and the seize
			case threadGone(t.pid, tid):
				// Exiting: seizing a dying thread fails with EPERM. Not
				// counted as new (a dying thread clones nothing): the
				// exited main thread of a process that runs on stays in
				// the list for good (D95).
				continue
			case err == unix.EPERM && tracerOf(tid) == t.tid: // TracerPid is the tracer thread's id
				// auto-attached as a clone of a thread we seized
			case err == unix.EPERM && len(patient) > 0 && time.Now().Before(patient[0]) && tracerOf(tid) > 0:
				time.Sleep(100 * time.Microsecond) // its tracer is detaching: poll
				fresh++                            // not settled: scan again
				waited = tid
				continue
			default:
				return attachErr(tid, err)
			}
			fresh++
			if _, ok := t.threads[tid]; !ok {
				t.threads[tid] = &thread{tid: tid, announced: true}
			}
		}
		if fresh == 0 {
			return nil
		}
	}
}

func (t *Tracer) cleanup() {
	if t.mem >= 0 {
		unix.Close(t.mem)
		t.mem = -1
	}
	t.detached = true
}

func listThreads(pid int) ([]int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
		}
		return nil, err
	}
	var tids []int
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	sort.Ints(tids)
	return tids, nil
}

// tracerOf returns the TracerPid of a thread, or -1.
func tracerOf(tid int) int { return procfs.TracerPid(tid, 0) }

func attachErr(tid int, err error) error {
	switch err {
	case unix.ESRCH:
		return fmt.Errorf("attach to thread %d: %w", tid, ErrNoProcess)
	case unix.EPERM:
		if procfs.LeaderExited(tid) {
			return fmt.Errorf("pid %d: %w", tid, ErrLeaderExited)
		}
		if err := procfs.Zombie(tid); err != nil {
			return err
		}
		if who := tracerOf(tid); who > 0 {
			return fmt.Errorf("attach to thread %d: %w by %s: %w", tid, ErrTraced, describe(who), ErrPermission)
		}
		var pst unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d", tid), &pst) != nil {
			return fmt.Errorf("attach to thread %d: %w", tid, ErrNoProcess)
		}
		if notDumpable(tid, int(pst.Uid)) {
			return fmt.Errorf("attach to thread %d: the process is yours but not dumpable (it runs a set-id or file-capability program, or called prctl(PR_SET_DUMPABLE, 0)): tracing it needs CAP_SYS_PTRACE: %w", tid, ErrPermission)
		}
		return fmt.Errorf("attach to thread %d (%s): %w", tid, permissionHint(yamaScope(), os.Geteuid()), ErrPermission)
	}
	return fmt.Errorf("attach to thread %d: %w", tid, err)
}

// notDumpable reports whether thread tid, whose /proc directory belongs
// to procUID, is a process of ours by its real uid that the kernel does
// not let us trace: its /proc files belong to root (the kernel's mark of a
// process that is not dumpable: a set-id or file-capability exec, or
// prctl(PR_SET_DUMPABLE, 0)). Root traces those anyway.
func notDumpable(tid, procUID int) bool {
	euid := os.Geteuid()
	if euid == 0 || procUID == euid {
		return false
	}
	st, err := procfs.ReadStatus(tid, 0)
	if err != nil {
		return false
	}
	f := strings.Fields(st["Uid"]) // real, effective, saved, filesystem
	return len(f) == 4 && f[0] == strconv.Itoa(euid)
}

// yamaScope is kernel.yama.ptrace_scope, "" without Yama.
func yamaScope() string {
	b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// permissionHint says what a refused attach needs, given Yama's
// ptrace_scope (docs/protocols.md "Refusals"): at 3 nobody may attach, not
// even root, until a reboot; at 2 only CAP_SYS_PTRACE; at 1 root or the
// tracee's parent.
func permissionHint(scope string, euid int) string {
	switch scope {
	case "3":
		return "kernel.yama.ptrace_scope is 3: no process may be traced, not even by root, until a reboot"
	case "2":
		return "kernel.yama.ptrace_scope is 2: needs CAP_SYS_PTRACE"
	case "1":
		if euid != 0 {
			return "kernel.yama.ptrace_scope is 1: needs root or CAP_SYS_PTRACE"
		}
	}
	return "needs root or CAP_SYS_PTRACE"
}

func mapErrno(err error) error {
	switch err {
	case unix.ENOENT, unix.ESRCH:
		return fmt.Errorf("%v: %w", err, ErrNoProcess)
	case unix.EPERM, unix.EACCES:
		return fmt.Errorf("%v: %w", err, ErrPermission)
	}
	return err
}

// Do runs fn on the tracer thread and returns its error. Inside fn the
// tracer's methods run directly; from any other goroutine each is a Do.
func (t *Tracer) Do(fn func() error) error {
	if t.onThread() {
		if t.inline && t.depth == 0 && !t.detached {
			// What the server loop does between requests.
			t.pump()
		}
		t.depth++
		defer func() { t.depth-- }()
		return fn()
	}
	if t.inline {
		return t.wrongThread()
	}
	errc := make(chan error, 1)
	select {
	case t.reqs <- func() { errc <- fn() }:
		return <-errc
	case <-t.done:
		return ErrDetached
	}
}

func (t *Tracer) onThread() bool { return unix.Gettid() == t.tid }

// ThreadMem is the target's memory as the tracer thread reaches it, lent by
// DoMem to the function it runs there. Its reads and writes are the system
// calls themselves: no hand-off and no check of the calling thread, which
// Tracer.ReadMem and WriteMem make with a gettid per call (a session's
// toggle made three). That is safe because of how one is obtained, not
// because of a check: only DoMem makes a ThreadMem, on the tracer thread,
// inside the request it runs there, and the ThreadMem stops working when
// that function returns. The function must use it on its own goroutine (the
// tracer's) and must not hand it on.
type ThreadMem struct {
	t    *Tracer
	lent bool // fn of the DoMem that made it is running
}

// DoMem runs fn on the tracer thread, as Do, with the target's memory as
// that thread reaches it (ThreadMem). Inside a Do (or DoMem) it runs fn
// directly.
func (t *Tracer) DoMem(fn func(m *ThreadMem) error) error {
	return t.Do(func() error {
		m := &ThreadMem{t: t, lent: true}
		defer func() { m.lent = false }()
		return fn(m)
	})
}

// Pid is the traced process.
func (m *ThreadMem) Pid() int { return m.t.pid }

// ReadMem reads len(b) bytes at addr through the tracer's /proc/PID/mem.
func (m *ThreadMem) ReadMem(addr uint64, b []byte) error {
	if err := m.usable(); err != nil {
		return err
	}
	return readLarge(m.t.pid, m.t.mem, addr, b)
}

// WriteMem writes b at addr with one pwrite (atomic only for one byte).
func (m *ThreadMem) WriteMem(addr uint64, b []byte) error {
	if err := m.usable(); err != nil {
		return err
	}
	return memWrite(m.t.mem, addr, b)
}

func (m *ThreadMem) usable() error {
	if !m.lent {
		return fmt.Errorf("pid %d: memory used after the DoMem that lent it returned: %w", m.t.pid, ErrNotLent)
	}
	return m.t.usable()
}

// ---- memory ----

// ReadMem reads len(b) bytes at addr of the target through /proc/PID/mem.
func (t *Tracer) ReadMem(addr uint64, b []byte) error {
	return t.Do(func() error {
		if err := t.usable(); err != nil {
			return err
		}
		return readLarge(t.pid, t.mem, addr, b)
	})
}

// WriteMem writes b at addr of the target through /proc/PID/mem (one pwrite,
// a kernel memcpy: atomic only for a single byte).
func (t *Tracer) WriteMem(addr uint64, b []byte) error {
	return t.Do(func() error {
		if err := t.usable(); err != nil {
			return err
		}
		return memWrite(t.mem, addr, b)
	})
}

func (t *Tracer) usable() error {
	switch {
	case t.detached:
		return ErrDetached
	case t.execed:
		return fmt.Errorf("pid %d: %w", t.pid, ErrExec)
	case t.exited:
		return fmt.Errorf("pid %d: %w", t.pid, ErrExited)
	}
	return nil
}

// vmReadMin is the read from which readLarge tries process_vm_readv first:
// below it, one pread of /proc/PID/mem costs less; from 16 KiB on,
// process_vm_readv costs a quarter to a third less kernel time per page
// (it pins up to 16 pages per call and copies once; mem_rw looks up the
// mapping, pins and copies through a bounce page for each page: D51).
const vmReadMin = 16 << 10

// readLarge is memRead for the large reads of a flip batch (grouped site
// reads, a span's re-read and read-back): one process_vm_readv of pid when
// b is at least vmReadMin bytes, else, and whenever that does not read all
// of b (a gap, a page it may not read without FOLL_FORCE, Yama, the process
// gone), one pread of fd, whose errors are the ones callers see. Either
// reads the same pages; only writes need FOLL_FORCE (/proc/PID/mem). After
// an execve, process_vm_readv reads the new image while fd reaches none:
// every write still goes through fd, so nothing is written into a new
// image (docs/protocols.md).
func readLarge(pid, fd int, addr uint64, b []byte) error {
	if len(b) >= vmReadMin && pid > 0 {
		if n, err := vmRead(pid, addr, b); err == nil && n == len(b) {
			return nil
		}
	}
	return memRead(fd, addr, b)
}

func memRead(fd int, addr uint64, b []byte) error {
	for {
		n, err := unix.Pread(fd, b, int64(addr))
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.ESRCH || (err == nil && n == 0 && len(b) > 0):
			return fmt.Errorf("read %#x: %w", addr, ErrExited)
		case err != nil:
			return fmt.Errorf("read %d bytes at %#x: %w", len(b), addr, mapErrno(err))
		case n != len(b):
			return fmt.Errorf("read %d bytes at %#x: short read (%d)", len(b), addr, n)
		}
		return nil
	}
}

func memWrite(fd int, addr uint64, b []byte) error {
	for {
		n, err := unix.Pwrite(fd, b, int64(addr))
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.ESRCH || (err == nil && n == 0 && len(b) > 0):
			return fmt.Errorf("write %#x: %w", addr, ErrExited)
		case err != nil:
			return fmt.Errorf("write %d bytes at %#x: %w", len(b), addr, mapErrno(err))
		case n != len(b):
			// Cannot happen within one page; a partial multi-byte write
			// would be a torn site, so say so loudly.
			return fmt.Errorf("write %d bytes at %#x: short write (%d)", len(b), addr, n)
		}
		return nil
	}
}

// ---- event loop ----

// pump reaps every pending event without blocking. __WNOTHREAD restricts
// wait4 to this thread's tracees, so children that other goroutines of this
// program started (and wait for) are never reaped here.
func (t *Tracer) pump() bool {
	got := false
	for {
		// Once an int3 of ours may be in the text, every event is looked
		// at before it is reaped (prewind), and the one looked at is the
		// one reaped: Wait4(-1) could reap another thread's stop that
		// arrived meanwhile, unseen.
		which := -1
		if len(t.traps) > 0 {
			pid, err := t.prewind()
			if err == unix.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				if err == unix.ECHILD && len(t.threads) > 0 {
					t.threads = map[int]*thread{}
					t.exited = true
				}
				return got
			}
			which = pid
		}
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(which, &ws, unix.WNOHANG|unix.WALL|unix.WNOTHREAD, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || wpid <= 0 {
			if err == unix.ECHILD && len(t.threads) > 0 {
				// No tracee left at all: the process is gone.
				t.threads = map[int]*thread{}
				t.exited = true
			}
			return got
		}
		got = true
		t.handle(wpid, ws)
	}
}

// prewind looks at the next event before it is reaped: if it is a SIGTRAP
// signal-delivery-stop of one of our threads at an address we armed, the
// thread's PC goes back to the site now, while the stop is unreaped. Reaping
// a stop clears the tracee's exit code (the signal it will take when
// resumed): a tracer killed between reaping a SIGTRAP stop and rewinding
// the PC released the thread past the int3 with the signal gone, and it
// ran the rest of the site as instructions (the SIGILL of D71, found with
// a core in killsafe6: PC = site + 3, DF set and rbx pushed, i.e. it ran
// 53 (push rbx) and fd (std) of a call's rel32). Rewound first, a tracer
// that dies before reaping leaves the SIGTRAP to be delivered at PC = site
// (the runtime's handler takes that, D89), one that dies after leaves the
// thread at the site with no signal: it executes the int3 again.
// armedAny reports whether a trap is armed now.
func (t *Tracer) armedAny() bool {
	for _, tr := range t.traps {
		if tr.armed {
			return true
		}
	}
	return false
}

// cldTrapped is si_code CLD_TRAPPED: a traced child stopped.
const cldTrapped = 4

// It returns the pid of the event it looked at (0: none) and waitid's error.
func (t *Tracer) prewind() (int, error) {
	pid, code, status, err := peekWait()
	if err != nil || pid <= 0 {
		return 0, err
	}
	if code != cldTrapped || status != int32(unix.SIGTRAP) {
		return pid, nil
	}
	th := t.threads[pid]
	if th == nil || th.prewound {
		return pid, nil
	}
	si, serr := getSiginfo(pid)
	if serr != nil || si.Code != 0x80 /* SI_KERNEL */ {
		return pid, nil
	}
	var regs Regs
	if unix.PtraceGetRegs(pid, &regs) != nil || t.traps[regs.Rip-1] == nil {
		return pid, nil
	}
	regs.Rip--
	if unix.PtraceSetRegs(pid, &regs) == nil {
		th.prewound = true
		t.stats.Prewound++
	}
	return pid, nil
}

func (t *Tracer) handle(wpid int, ws unix.WaitStatus) {
	if ws.Exited() || ws.Signaled() {
		delete(t.kids, wpid)
		delete(t.early, wpid)
		if th := t.threads[wpid]; th != nil && !th.announced {
			// Its creator's clone event is still to come: remember, so that
			// event does not bring the dead thread back.
			t.unborn[wpid] = true
		}
		delete(t.threads, wpid)
		if wpid == t.pid {
			t.exited = true
		}
		return
	}
	if !ws.Stopped() {
		return
	}
	if kind, ok := t.kids[wpid]; ok {
		t.firstStop(wpid, kind)
		return
	}
	th := t.threads[wpid]
	if th == nil && wpid != t.tgid() && tgidOf(wpid) != t.tgid() && tgidOf(wpid) > 0 {
		// A child process whose first stop came before its parent's fork
		// or vfork event: keep it stopped until that event says which.
		t.early[wpid] = true
		return
	}
	if th == nil { // a new thread whose stop came before its creator's clone event
		delete(t.unborn, wpid) // a reused tid is alive again
		th = &thread{tid: wpid}
		t.threads[wpid] = th
		t.stats.Clones++
	}
	if th.syncWant {
		// Stopped for our Sync: make sure its way back to user mode
		// serialises (see forceIRET).
		t.forceIRET(th.tid)
	}
	th.syncWant = false // any ptrace-stop is a kernel entry and exit
	sig := int(ws.StopSignal())
	event := int(ws) >> 16
	if event != 0 || sig != int(unix.SIGTRAP) {
		th.prewound = false // prewind marks only a SIGTRAP signal-delivery-stop
	} else if t.opts.KillAtTrap && t.armedAny() {
		_ = unix.Kill(unix.Getpid(), unix.SIGKILL)
	}
	if event != unix.PTRACE_EVENT_VFORK {
		// A thread blocked in vfork reports no stop until the vfork ends
		// (its wait is killable only): any other stop means it is out.
		th.inVfork = false
	}
	switch {
	case event == unix.PTRACE_EVENT_CLONE:
		if msg, err := unix.PtraceGetEventMsg(wpid); err == nil {
			tid := int(msg)
			switch nt := t.threads[tid]; {
			case t.unborn[tid]:
				delete(t.unborn, tid) // born, ran and exited already
			case nt != nil:
				nt.announced = true
			default:
				t.threads[tid] = &thread{tid: tid, announced: true}
				t.stats.Clones++
			}
		}
		th.kind = stopPlain
	case event == unix.PTRACE_EVENT_FORK || event == unix.PTRACE_EVENT_VFORK:
		if msg, err := unix.PtraceGetEventMsg(wpid); err == nil {
			kid := int(msg)
			if t.early[kid] {
				delete(t.early, kid)
				t.firstStop(kid, event)
			} else {
				t.kids[kid] = event
			}
		}
		th.inVfork = event == unix.PTRACE_EVENT_VFORK
		th.kind = stopPlain
	case event == unix.PTRACE_EVENT_VFORK_DONE:
		th.inVfork = false
		th.kind = stopPlain
	case event == unix.PTRACE_EVENT_EXEC && wpid != t.pid && wpid == t.tgid():
		// Traced through one of its threads (its main thread had exited,
		// D95) and another thread called execve: the kernel killed every
		// other thread, ours among them, and the execing thread now has
		// the process's pid. As for an exec by the thread we traced.
		t.pid = wpid
		t.execed = true
		t.threads = map[int]*thread{wpid: th}
		th.kind = stopPlain
	case event == unix.PTRACE_EVENT_EXEC && wpid != t.pid:
		// A vfork child (traced like a thread) called execve: it has its
		// own text now, none of our traps. Let it go.
		delete(t.threads, wpid)
		_ = detach(wpid, 0)
		return
	case event == unix.PTRACE_EVENT_EXEC:
		// Every other thread is gone; the execing thread now has tid pid.
		t.execed = true
		t.threads = map[int]*thread{wpid: th}
		th.kind = stopPlain
	case event == unix.PTRACE_EVENT_STOP && th.moving:
		// The interrupt-stop of a thread that trapped at an armed site
		// (isOurTrap): hold it here, PC at the site, while the trap is
		// armed.
		// The trap may have been released and armed again meanwhile: it is
		// whichever arming is current that holds the thread.
		th.moving = false
		if tr := t.traps[th.trapAt]; tr != nil && tr.armed {
			th.kind = stopTrap
			tr.held = append(tr.held, th.tid)
			t.stats.TrapsHeld++
			return
		}
		th.kind = stopPlain
	case event == unix.PTRACE_EVENT_STOP:
		if sig == int(unix.SIGTRAP) {
			th.kind = stopPlain // our PTRACE_INTERRUPT, or a new thread's first stop
		} else {
			th.kind = stopGroup
			t.stats.GroupStops++
		}
	case event != 0:
		th.kind = stopPlain
	case sig == int(unix.SIGTRAP) && t.isOurTrap(th):
		if th.moving {
			return // held at its interrupt-stop, which comes next
		}
	default:
		th.kind = stopSignal
		th.sig = sig
		t.stats.Signals++
	}
	t.dispose(th)
}

// isOurTrap reports whether a SIGTRAP stop is an int3 (si_code SI_KERNEL) at
// an address we own. At an armed address the thread is marked to be held; at
// a disarmed one (a stale int3) its PC is rewound to the site.
func (t *Tracer) isOurTrap(th *thread) bool {
	prewound := th.prewound
	th.prewound = false
	if len(t.traps) == 0 {
		return false
	}
	si, err := getSiginfo(th.tid)
	if err != nil || si.Code != 0x80 /* SI_KERNEL */ {
		return false
	}
	var regs Regs
	if err := unix.PtraceGetRegs(th.tid, &regs); err != nil {
		return false
	}
	addr := regs.Rip - 1
	if prewound {
		addr = regs.Rip // set back before the stop was reaped (prewind)
	}
	tr := t.traps[addr]
	if tr == nil {
		return false
	}
	regs.Rip = addr
	if err := unix.PtraceSetRegs(th.tid, &regs); err != nil {
		return false
	}
	if tr.armed {
		// Hold the thread, but not in this signal-delivery-stop: if we died
		// (SIGKILL) while it sat here, the kernel would deliver the SIGTRAP
		// and kill the process. Rewound to the site, the SIGTRAP discarded
		// and an interrupt pending, it goes straight from here into an
		// interrupt-stop without running a user instruction; released from
		// that stop by our death it resumes at the site, a whole
		// instruction once the site is restored (hotpatch repair).
		th.trapAt = addr
		if err := unix.PtraceInterrupt(th.tid); err != nil {
			return false
		}
		if err := unix.PtraceCont(th.tid, 0); err != nil {
			return false
		}
		th.kind, th.sig, th.moving = running, 0, true
		return true
	}
	th.kind = stopSuppressed
	t.stats.StaleTraps++
	return true
}

// firstStop handles the first stop of a child process, once its parent's
// event has said how it was made. A forked child has its own copy of the
// text, taken at some instant of the batch: every address we ever armed
// that holds an int3 there gets its registered whole form (ForkForm), and
// the child is detached only then, before it ran a single instruction. A
// vfork child shares the parent's text (and runs while the parent waits):
// it is traced like one more thread, held at traps and synced, until it
// execs or exits.
func (t *Tracer) firstStop(kid, kind int) {
	delete(t.kids, kid)
	if kind == kidFork {
		if sameVM(kid, liveTask(t.pid)) {
			// clone(CLONE_VM) without CLONE_THREAD, reported as a fork:
			// not a copy of the text but the very text, run by another
			// process. Repairing "its copy" would write whole forms into
			// ours mid-protocol, and detaching it would leave it to die
			// of the next int3 it meets: it is traced like a vfork child,
			// as one more thread (held at traps, synced), until it execs
			// or exits.
			kind = kidVfork
		}
	}
	if kind == kidVfork {
		t.stats.Vforks++
		th := &thread{tid: kid, announced: true, kind: stopPlain}
		t.threads[kid] = th
		t.dispose(th)
		return
	}
	t.stats.Forks++
	n, err := t.repairChild(kid)
	t.stats.Repaired += uint64(n)
	if err != nil {
		// The child could not be made whole: it must not run what it
		// holds. A program sees a child killed at birth, not one that
		// dies later of a SIGTRAP with no one to catch it.
		_ = unix.Kill(kid, unix.SIGKILL)
	}
	_ = detach(kid, 0)
}

// repairChild rewrites, in a stopped forked child, every registered site
// whose byte 0 is an int3, returning how many it wrote.
func (t *Tracer) repairChild(kid int) (int, error) {
	if len(t.forkForms) == 0 {
		return 0, nil
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/mem", kid), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, mapErrno(err)
	}
	defer unix.Close(fd)
	for addr := range t.traps {
		if _, ok := t.forkForms[addr]; ok {
			continue
		}
		b := []byte{0}
		if err := memRead(fd, addr, b); err != nil {
			return 0, err
		}
		if b[0] == 0xcc {
			return 0, fmt.Errorf("child %d holds an int3 at %#x and no whole form is registered", kid, addr)
		}
	}
	n := 0
	for addr, form := range t.forkForms {
		b := []byte{0}
		if err := memRead(fd, addr, b); err != nil {
			return n, err
		}
		if b[0] != 0xcc {
			continue // whole: the int3 protocols change byte 0 first and last
		}
		if err := memWrite(fd, addr, form); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// tgidOf returns the thread group of a task, or -1.
// tgid is the process of the traced thread: t.pid itself, or the
// process's pid when we trace it through another thread (Options.Process,
// D95).
func (t *Tracer) tgid() int {
	if t.opts.Process > 0 {
		return t.opts.Process
	}
	return t.pid
}

func tgidOf(tid int) int {
	st, err := procfs.ReadStatus(tid, 0)
	if err != nil {
		return -1
	}
	return st.Int("Tgid")
}

// dispose resumes a stopped thread unless we hold every thread.
func (t *Tracer) dispose(th *thread) {
	if t.hold || th.kind == stopTrap {
		return
	}
	t.resume(th)
}

func (t *Tracer) resume(th *thread) {
	var err error
	switch th.kind {
	case running:
		return
	case stopGroup:
		err = listen(th.tid)
	case stopSignal:
		err = unix.PtraceCont(th.tid, th.sig)
	default:
		err = unix.PtraceCont(th.tid, 0)
	}
	_ = err // ESRCH: the thread died; its exit arrives through wait4
	th.kind, th.sig = running, 0
}

// waitFor pumps events until cond holds, the process is gone, ctx is done or
// the timeout elapses. It spins briefly (events we provoked arrive within
// microseconds), then sleeps on SIGCHLD.
func (t *Tracer) waitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	start := time.Now()
	for spins := 0; ; spins++ {
		t.pump()
		if cond() {
			return nil
		}
		if t.exited {
			return fmt.Errorf("pid %d: %w", t.pid, ErrExited)
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if spins >= 500 && spins%100 == 0 && t.dropZombieLeader() {
			continue // the condition may hold without it
		}
		if time.Since(start) > timeout {
			return fmt.Errorf("waiting for %s: timed out after %v (%s)", what, timeout, t.describe())
		}
		if spins < 500 || t.sleepy() {
			continue
		}
		tm := time.NewTimer(time.Millisecond)
		select {
		case <-t.sigchld:
		case <-tm.C:
		case <-ctx.Done():
		}
		tm.Stop()
	}
}

// dropZombieLeader forgets the leader once it has exited while other
// threads run on (pthread_exit in main): the kernel reports no exit for it
// until the whole process ends, and a zombie never stops, so a wait for
// every thread to stop would time out on it. It stays traced by us (the
// caller's lock, D95) until this thread exits. Looked at only in a wait
// that has already spun for a while: it reads /proc.
func (t *Tracer) dropZombieLeader() bool {
	th := t.threads[t.pid]
	if th == nil || th.kind != running || !procfs.LeaderExited(t.pid) {
		return false
	}
	delete(t.threads, t.pid)
	return true
}

// Pause keeps serving events (holding trapped threads, forwarding signals)
// for d. It does not return early: the protocols' waits are a safety margin.
func (t *Tracer) Pause(d time.Duration) {
	_ = t.Do(func() error {
		end := time.Now().Add(d)
		for {
			t.pump()
			left := time.Until(end)
			if left <= 0 {
				return nil
			}
			if left > 500*time.Microsecond && !t.sleepy() {
				tm := time.NewTimer(left - 200*time.Microsecond)
				select {
				case <-t.sigchld:
				case <-tm.C:
				}
				tm.Stop()
			}
		}
	})
}

// Pump serves pending events now, without blocking.
func (t *Tracer) Pump() { _ = t.Do(func() error { t.pump(); return nil }) }

// ---- whole-process operations ----

// Threads returns the tracked thread ids.
func (t *Tracer) Threads() []int {
	var tids []int
	_ = t.Do(func() error {
		for tid := range t.threads {
			tids = append(tids, tid)
		}
		return nil
	})
	sort.Ints(tids)
	return tids
}

// Stats returns the event counters.
func (t *Tracer) Stats() Stats {
	var s Stats
	_ = t.Do(func() error {
		t.pump()
		s = t.stats
		s.Threads = len(t.threads)
		return nil
	})
	return s
}

func (t *Tracer) needAll(op string) error {
	if t.opts.LeaderOnly {
		return fmt.Errorf("%s: tracer was attached with LeaderOnly", op)
	}
	return t.usable()
}

// Sync makes every thread pass through the kernel once after the call:
// each running thread is interrupted and resumed as soon as it reports its
// stop (a rolling barrier, not a stop-the-world). Threads already in a
// ptrace-stop are in the kernel and count at once. On x86 a thread
// interrupted in user mode returns through IRET, a serialising instruction,
// so afterwards no thread can execute instruction bytes fetched before the
// call. On error (ctx, timeout, exit) some threads may not have synced.
func (t *Tracer) Sync(ctx context.Context) error {
	return t.Do(func() error {
		if err := t.needAll("sync"); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("sync: %w", err)
		}
		t.pump()
		for _, th := range t.threads {
			if th.kind != running {
				t.forceIRET(th.tid) // already stopped: counts, and returns through IRET
			}
			if th.kind == running && !th.inVfork && !th.moving {
				th.syncWant = true
				if err := unix.PtraceInterrupt(th.tid); err != nil {
					th.syncWant = false // ESRCH: it is exiting
				}
			}
		}
		err := t.waitFor(ctx, t.opts.StopTimeout, "threads to sync", func() bool {
			for _, th := range t.threads {
				if th.syncWant {
					return false
				}
			}
			return true
		})
		if err == nil {
			t.stats.Syncs++
		}
		return err
	})
}

// StopAll interrupts every thread and waits until each is in a ptrace-stop,
// returning their registers; threads born meanwhile are held at their first
// stop. Call ResumeAll afterwards, also after an error.
func (t *Tracer) StopAll(ctx context.Context) ([]ThreadState, error) {
	var out []ThreadState
	err := t.Do(func() error {
		if err := t.needAll("stop"); err != nil {
			return err
		}
		t.hold = true
		t.pump()
		for _, th := range t.threads {
			if th.kind == running && !th.inVfork {
				_ = unix.PtraceInterrupt(th.tid) // ESRCH: exiting, reported by wait4
			}
		}
		if err := t.waitFor(ctx, t.opts.StopTimeout, "threads to stop", func() bool {
			for _, th := range t.threads {
				// A thread waiting for its vfork child is in the kernel and
				// cannot take a stop until the child execs or exits.
				if th.kind == running && !th.inVfork {
					return false
				}
			}
			return true
		}); err != nil {
			return err
		}
		for _, th := range t.threads {
			t.forceIRET(th.tid)
			var r Regs
			if err := unix.PtraceGetRegs(th.tid, &r); err != nil {
				continue // it died while stopped (SIGKILL)
			}
			out = append(out, ThreadState{Tid: th.tid, Regs: r, Group: th.kind == stopGroup})
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Tid < out[j].Tid })
		return nil
	})
	return out, err
}

// ResumeAll ends StopAll: every stopped thread not held at an armed trap
// resumes with its pending signal, if any.
func (t *Tracer) ResumeAll() error {
	return t.Do(func() error {
		t.hold = false
		for _, th := range t.threads {
			if th.kind != stopTrap {
				t.resume(th)
			}
		}
		t.pump()
		return nil
	})
}

// ---- trap addresses ----

// ArmTrap declares that the caller is about to write int3 at addr: a thread
// trapping there is held until ReleaseTrap. The address stays owned (stale
// traps there are rewound) until Detach.
func (t *Tracer) ArmTrap(addr uint64) error {
	return t.Do(func() error {
		if err := t.needAll("arm trap"); err != nil {
			return err
		}
		tr := t.traps[addr]
		if tr == nil {
			tr = &trap{}
			t.traps[addr] = tr
		}
		tr.armed = true
		return nil
	})
}

// ForkForm registers the whole form a forked child must hold at addr if it
// inherited an int3 there (a fork while a batch was in flight): one of the
// site's two valid forms, usually the one it held before the batch. The
// int3 protocols call it with ArmTrap; the last form registered wins, and
// it stays registered until Detach. Without a form, such a child would be
// killed at birth rather than left to die of the int3.
func (t *Tracer) ForkForm(addr uint64, form []byte) error {
	return t.Do(func() error {
		t.forkForms[addr] = append([]byte(nil), form...)
		return nil
	})
}

// ReleaseTrap disarms addr once the site is complete again: every thread
// held there gets PC = addr and resumes (no SIGTRAP is delivered). It
// returns how many threads were held.
func (t *Tracer) ReleaseTrap(addr uint64) (int, error) {
	n := 0
	err := t.Do(func() error {
		tr := t.traps[addr]
		if tr == nil {
			return nil
		}
		t.pump() // collect threads that trapped up to now
		tr.armed = false
		for _, tid := range tr.held {
			th := t.threads[tid]
			if th == nil || th.kind != stopTrap || th.trapAt != addr {
				continue
			}
			n++
			var r Regs
			if err := unix.PtraceGetRegs(tid, &r); err == nil {
				r.Rip = addr
				_ = unix.PtraceSetRegs(tid, &r)
			}
			th.kind = stopSuppressed
			t.dispose(th)
		}
		tr.held = nil
		return nil
	})
	return n, err
}

// Held returns how many threads are held at addr now.
func (t *Tracer) Held(addr uint64) int {
	n := 0
	_ = t.Do(func() error {
		t.pump()
		if tr := t.traps[addr]; tr != nil {
			for _, tid := range tr.held {
				if th := t.threads[tid]; th != nil && th.kind == stopTrap {
					n++
				}
			}
		}
		return nil
	})
	return n
}

// ---- detach ----

// Detach ends tracing and leaves no thread stopped by us: every thread is
// interrupted once (so none can still see a stale int3), then detached with
// its pending signal. It refuses with ErrArmed while a trap is armed: the
// caller must complete or roll back its sites first. After Detach every
// method returns ErrDetached.
func (t *Tracer) Detach() error {
	err := t.Do(func() error {
		if t.detached {
			return ErrDetached
		}
		for addr, tr := range t.traps {
			if tr.armed && !t.exited && !t.execed {
				return fmt.Errorf("detach from pid %d: trap at %#x: %w", t.pid, addr, ErrArmed)
			}
		}
		var err error
		if t.opts.LeaderOnly {
			// Nothing was ever stopped on purpose; exiting the tracer thread
			// detaches the leader without stopping it.
			t.pump()
		} else if !t.exited {
			_, err = t.stopAllLocked()
			if err == nil && len(t.traps) > 0 {
				err = t.flushTraps()
			}
			// The leader last: a caller that uses the attach of the leader
			// as its lock (hotpatch) must not let a waiter in while other
			// threads are still ours; if any is (never stopped), the leader
			// stays ours too until the tracer thread's exit releases all.
			leaderLast := func(th *thread) bool { return th.tid == t.pid }
			stillOurs := false
			for _, pass := range []bool{false, true} {
				for _, th := range t.threads {
					if leaderLast(th) != pass {
						continue
					}
					if th.kind == running || (pass && stillOurs) {
						stillOurs = true
						continue // never stopped (timeout): the thread exit below detaches it
					}
					sig := 0
					if th.kind == stopSignal {
						sig = th.sig
					}
					_ = detach(th.tid, sig)
				}
			}
		}
		t.threads = map[int]*thread{}
		t.cleanup()
		if t.inline {
			t.stopChld() // a tracer goroutine's serve does it as it ends
		}
		return err
	})
	if err == ErrDetached {
		return nil
	}
	if t.inline {
		// The thread's exit releases what is still traced, and Run waits
		// for that release (awaitRelease) before it returns.
		return err
	}
	<-t.done
	if rerr := t.awaitRelease(); err == nil {
		err = rerr
	}
	if t.pidfd >= 0 {
		unix.Close(t.pidfd)
		t.pidfd = -1
	}
	return err
}

// awaitRelease waits until no thread of the target names our tracer thread
// as its tracer. Threads left traced (the leader-only mode never stops one)
// are detached by the kernel when the tracer thread exits, and the Go runtime
// ends a locked thread only after its goroutine has returned: without this
// wait, a caller that seizes the process again at once (a Session switching
// from flip to int3) could find it still traced and fail with EPERM.
//
// With the tracer thread's pidfd (Linux 6.9), the wait is for it to turn
// readable: the kernel marks a thread exited (exit_state, what a thread
// pidfd's poll reports) after its exit has let go of every tracee
// (exit_notify: exit_ptrace first), so readable means released, without a
// read of /proc/PID/status, which costs about half a millisecond on a VM
// with many possible CPUs (its memory counters are summed over all of
// them: D71). Without one, the leader's (or every thread's) TracerPid is
// polled. The waits are system calls, not Go sleeps: the caller has
// nothing else to do, and a parked goroutine's wake-up is a hand-off
// between threads.
func (t *Tracer) awaitRelease() error {
	deadline := time.Now().Add(t.opts.StopTimeout)
	if t.pidfd >= 0 {
		for {
			left := time.Until(deadline)
			if left <= 0 {
				return fmt.Errorf("pid %d: tracer thread %d still running %v after detaching", t.pid, t.tid, t.opts.StopTimeout)
			}
			fds := []unix.PollFd{{Fd: int32(t.pidfd), Events: unix.POLLIN}}
			n, err := unix.Poll(fds, int(left.Milliseconds())+1)
			if err == unix.EINTR || (err == nil && n == 0) {
				continue
			}
			if err == nil && fds[0].Revents&(unix.POLLIN|unix.POLLHUP) != 0 {
				return nil // exited (POLLHUP: and reaped)
			}
			break // poll failed: ask /proc
		}
	}
	for t.stillTraced() {
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d: still traced by thread %d %v after detaching", t.pid, t.tid, t.opts.StopTimeout)
		}
		ts := unix.NsecToTimespec(int64(50 * time.Microsecond))
		_ = unix.Nanosleep(&ts, nil) // EINTR: look again
	}
	return nil
}

// stillTraced reports whether any thread of the target is traced by our
// tracer thread. A leader-only tracer never traced another (no clone,
// fork or vfork is followed in that mode): its leader's status says it.
func (t *Tracer) stillTraced() bool {
	if t.opts.LeaderOnly {
		return procfs.TracerPid(t.pid, 0) == t.tid
	}
	return tracedBy(t.pid, t.tid)
}

// tracedBy reports whether any thread of pid is traced by thread tracer.
func tracedBy(pid, tracer int) bool {
	tids, err := listThreads(pid)
	if err != nil {
		return false // the process is gone: nothing is traced
	}
	for _, tid := range tids {
		if procfs.TracerPid(pid, tid) == tracer {
			return true
		}
	}
	return false
}

func (t *Tracer) stopAllLocked() (int, error) {
	t.hold = true
	t.pump()
	for _, th := range t.threads {
		if th.kind == running && !th.inVfork {
			_ = unix.PtraceInterrupt(th.tid)
		}
	}
	err := t.waitFor(context.Background(), t.opts.StopTimeout, "threads to stop for detach", func() bool {
		for _, th := range t.threads {
			if th.kind == running && !th.inVfork {
				return false
			}
		}
		// Every child forked so far has had its first stop handled:
		// detaching before would let it run unrepaired.
		return len(t.kids) == 0 && len(t.early) == 0
	})
	if errors.Is(err, ErrExited) {
		err = nil
	}
	for _, th := range t.threads {
		if th.kind != running {
			t.forceIRET(th.tid)
		}
	}
	return len(t.threads), err
}

// forceIRET makes a stopped thread's return to user mode take the kernel's
// IRET path, which is serialising, instead of SYSRET, which is not (issue
// 11: "every thread passes through an IRET" did not hold for a thread that
// was in a system call). Linux returns from a 64-bit syscall by SYSRET only
// when the saved rcx equals the saved rip (and r11 the flags): SYSRET
// reloads rip from rcx. A thread stopped inside a syscall (orig_rax >= 0)
// with rcx == rip gets rcx = rip+1, which is harmless: the SYSCALL
// instruction clobbers rcx and r11 by definition of the ABI, so no program
// reads them after a syscall; a restarted syscall executes SYSCALL again,
// which rewrites rcx. A thread that entered the kernel by an interrupt or
// exception (orig_rax = -1) returns through IRET anyway and is not touched.
func (t *Tracer) forceIRET(tid int) {
	var r Regs
	if err := unix.PtraceGetRegs(tid, &r); err != nil {
		return
	}
	if int64(r.Orig_rax) < 0 || r.Rcx != r.Rip {
		return
	}
	r.Rcx = r.Rip + 1
	_ = unix.PtraceSetRegs(tid, &r)
}

// describe lists the threads that are not in a known stop, for errors.
func (t *Tracer) describe() string {
	var parts []string
	for _, th := range t.threads {
		if th.kind != running && !th.syncWant {
			continue
		}
		state := "gone"
		if st, err := procfs.ReadStat(t.pid, th.tid); err == nil {
			state = string(st.State)
		}
		parts = append(parts, fmt.Sprintf("thread %d state %s", th.tid, state))
	}
	sort.Strings(parts)
	if len(parts) > 8 {
		parts = append(parts[:8], fmt.Sprintf("and %d more", len(parts)-8))
	}
	return "not stopped: " + strings.Join(parts, ", ")
}

// threadGone reports whether a thread has exited or is exiting.
func threadGone(pid, tid int) bool { return procfs.Gone(pid, tid) }

// flushTraps runs, before detaching, every stopped thread that still has a
// SIGTRAP pending: an int3 it executed can be reported after the
// PTRACE_INTERRUPT stop we just saw (the kernel handles job-control traps
// before dequeuing signals). Detached with it pending, the thread would take
// the SIGTRAP with no tracer and, without a handler, kill the process. Run
// once more, it reports the SIGTRAP stop, which is rewound as a stale trap.
func (t *Tracer) flushTraps() error {
	for round := 0; round < 100; round++ {
		n := 0
		for _, th := range t.threads {
			if th.kind != running && sigPending(t.pid, th.tid, unix.SIGTRAP) {
				t.resume(th)
				n++
			}
		}
		if n == 0 {
			return nil
		}
		if err := t.waitFor(context.Background(), t.opts.StopTimeout, "pending SIGTRAPs", func() bool {
			for _, th := range t.threads {
				// A thread blocked in vfork cannot stop before its child
				// (stopped here) exits: it is in the kernel, not a runner.
				if th.kind == running && !th.inVfork {
					return false
				}
			}
			return true
		}); err != nil {
			if errors.Is(err, ErrExited) {
				return nil
			}
			return err
		}
	}
	return fmt.Errorf("threads of pid %d keep a SIGTRAP pending", t.pid)
}

// sigPending reports whether sig is pending for the thread itself (SigPnd)
// or its process (ShdPnd).
func sigPending(pid, tid int, sig unix.Signal) bool {
	st, err := procfs.ReadStatus(pid, tid)
	if err != nil {
		// A vfork child traced like a thread is not under pid's task/.
		if st, err = procfs.ReadStatus(tid, 0); err != nil {
			return false
		}
	}
	bit := uint64(1) << (uint(sig) - 1)
	return (st.SigMask("SigPnd")|st.SigMask("ShdPnd"))&bit != 0
}

// describe names a tracer thread by its process: "pid 4242 (strace)".
func describe(tid int) string {
	pid := tid
	if st, err := procfs.ReadStatus(tid, 0); err == nil {
		if n := st.Int("Tgid"); n > 0 {
			pid = n
		}
	}
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil {
		if name := strings.TrimSpace(string(comm)); name != "" {
			return fmt.Sprintf("pid %d (%s)", pid, name)
		}
	}
	return fmt.Sprintf("pid %d", pid)
}
