package hotpatch

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/ptrace"
)

// ErrBusy means another hotpatch (or any other tracer: gdb, strace) holds
// the target.
var ErrBusy = errors.New("the process has a tracer already (another hotpatch, a debugger, strace)")

// Lock serialises hotpatch runs on one process: two patchers interleaving
// their reads and writes of the same sites could each verify a state the
// other is about to change. The lock is the ptrace attach itself: a process
// has at most one tracer, so PTRACE_SEIZE of its leader (which stops
// nothing) either makes us the only patcher or fails with EPERM, and
// /proc/PID/status names the holder (TracerPid). Nothing is created in the
// file system, so no other user can plant, hold, redirect or read it, and
// nothing is left behind: the kernel drops the attach when we exit, however
// we exit (docs/decisions.md; issue 11 found the old lock files in
// world-writable /run/lock blockable by any user and followed as symlinks).
//
// A process whose main thread has exited (pthread_exit in main) cannot
// have its leader seized. Its lock is then an exclusive flock of the
// process's /proc/PID/fd directory (D95): a file only the process's owner
// and root may open, which lives while the process does, and whose lock
// the kernel drops when we exit. The seize of a live thread (the anchor)
// follows it: every /proc file and ptrace request of the session goes
// through that thread, since the leader's reach none of its memory.
type Lock struct {
	t *ptrace.Tracer
	// via is the thread every /proc path and ptrace request names: the
	// process's pid, or the anchor when its main thread has exited.
	via int
	// fd is the flocked /proc/PID/fd of a process whose main thread has
	// exited, or -1.
	fd int
	// keep: the flock outlives Release and the session's Close (Apply
	// drops it once its tracer thread has exited and let go).
	keep bool
}

// AcquireLock takes the lock for pid; with wait it polls until the holder
// lets go, without it a held lock is ErrBusy naming the holder.
func AcquireLock(pid int, wait bool) (*Lock, error) {
	return AcquireLockContext(context.Background(), pid, wait)
}

// AcquireLockContext is AcquireLock whose wait ends when ctx does.
func AcquireLockContext(ctx context.Context, pid int, wait bool) (*Lock, error) {
	for {
		t, err := ptrace.Attach(pid, lockOptions())
		if err == nil {
			return &Lock{t: t, via: pid, fd: -1}, nil
		}
		if errors.Is(err, ptrace.ErrLeaderExited) {
			l, err := acquireExited(ctx, pid, wait)
			if errors.Is(err, errLeaderBack) {
				continue // an exec from another thread made a new main thread: seize it
			}
			return l, err
		}
		if !errors.Is(err, ptrace.ErrTraced) {
			return nil, err // a real permission problem, or no process
		}
		holder := tracerOf(pid)
		if holder <= 0 {
			continue // it let go between our attempt and our look: try again
		}
		if err := busy(ctx, pid, describeTracer(holder), wait); err != nil {
			return nil, err
		}
	}
}

func lockOptions() ptrace.Options {
	return ptrace.Options{LeaderOnly: true, KillAtTrap: os.Getenv(EnvTestKillAt) == "trap-reaped"}
}

// busy is the answer to a lock held by who: ErrBusy without wait, else a
// pause of 10 ms (there is no event for a release) or ctx's end.
func busy(ctx context.Context, pid int, who string, wait bool) error {
	if !wait {
		return fmt.Errorf("pid %d is traced by %s: %w (use --wait to queue behind it)", pid, who, ErrBusy)
	}
	select {
	case <-ctx.Done():
		return fmt.Errorf("waiting for %s to let go of pid %d: %w", who, pid, ctx.Err())
	case <-time.After(10 * time.Millisecond):
		return nil
	}
}

// errLeaderBack: the process has a live main thread again (another thread
// ran exec, which makes it the main one) while we took the lock of a
// process whose main thread had exited; the leader's seize applies again.
var errLeaderBack = errors.New("the process has a main thread again (exec)")

// acquireExited is the lock of a process whose main thread has exited
// (D95), in this order:
//  1. flock(LOCK_EX) of /proc/PID/fd: excludes every other hotpatch that
//     found the main thread exited, and the runtime's SIGTRAP handler,
//     which repairs only after taking and dropping the same lock;
//  2. the exited main thread's TracerPid is 0: a hotpatch that seized it
//     before it exited holds it until that hotpatch's thread exits, and
//     still counts as the holder (it took no flock);
//  3. the seize of the lowest live thread, which stops nothing (the
//     anchor): /proc/ANCHOR/mem and the rest reach the memory through it,
//     and a thread traced by someone else (a debugger) is busy as before.
func acquireExited(ctx context.Context, pid int, wait bool) (*Lock, error) {
	for {
		l, who, err := tryExited(pid)
		if err != nil || l != nil {
			return l, err
		}
		if err := busy(ctx, pid, who, wait); err != nil {
			return nil, err
		}
	}
}

// tryExited makes one attempt: the lock, or who holds it, or an error.
func tryExited(pid int) (*Lock, string, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		if !procfs.LeaderExited(pid) {
			return nil, "", fmt.Errorf("pid %d: %w", pid, procfs.ErrNoProcess)
		}
		return nil, "", fmt.Errorf("lock pid %d: open %s: %w", pid, dir, err)
	}
	for spins := 0; ; spins++ {
		err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if err != unix.EWOULDBLOCK {
			unix.Close(fd)
			return nil, "", fmt.Errorf("lock pid %d: flock %s: %w", pid, dir, err)
		}
		holder := flockHolder(fd)
		if holder != pid || spins >= 1000 {
			unix.Close(fd)
			if holder == pid {
				return nil, "its own SIGTRAP handler (a repair in progress)", nil
			}
			if holder <= 0 {
				return nil, "another hotpatch (it holds the lock of a process whose main thread has exited)", nil
			}
			return nil, describeTracer(holder), nil
		}
		// The runtime's handler takes and drops it to see no session runs
		// (D95): a moment, not a holder.
		time.Sleep(100 * time.Microsecond)
	}
	l := &Lock{via: pid, fd: fd}
	if holder := tracerOf(pid); holder > 0 {
		l.Release()
		return nil, describeTracer(holder), nil
	}
	if !procfs.LeaderExited(pid) {
		// Gone meanwhile, or exec from another thread made a new main
		// thread (de_thread): start again with the leader's seize.
		l.Release()
		if procfs.Gone(pid, 0) {
			return nil, "", fmt.Errorf("pid %d: %w", pid, procfs.ErrNoProcess)
		}
		return nil, "", errLeaderBack
	}
	tids, err := liveThreads(pid)
	if err != nil {
		l.Release()
		return nil, "", err
	}
	for _, tid := range tids {
		opts := lockOptions()
		opts.Process = pid
		t, err := ptrace.Attach(tid, opts)
		if err == nil {
			l.t, l.via = t, tid
			return l, "", nil
		}
		if errors.Is(err, ptrace.ErrTraced) {
			l.Release()
			if holder := tracerOf(tid); holder > 0 {
				return nil, describeTracer(holder), nil
			}
			return nil, "", err
		}
		if !errors.Is(err, ptrace.ErrNoProcess) && !procfs.Gone(pid, tid) {
			l.Release()
			return nil, "", err
		}
		// that thread exited meanwhile: the next one
	}
	l.Release()
	return nil, "", fmt.Errorf("pid %d: %w", pid, procfs.ErrNoProcess)
}

// liveThreads lists pid's threads other than pid itself, lowest first.
func liveThreads(pid int) ([]int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, fmt.Errorf("pid %d: %w", pid, procfs.ErrNoProcess)
	}
	var tids []int
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil && tid != pid {
			tids = append(tids, tid)
		}
	}
	sort.Ints(tids)
	return tids, nil
}

// flockHolder returns the pid /proc/locks names for the FLOCK on fd's
// file, or 0.
func flockHolder(fd int) int {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return 0
	}
	key := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	f, err := os.Open("/proc/locks")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "1: FLOCK  ADVISORY  WRITE 9510 00:15:9101320 0 EOF"; blocked
		// waiters are listed as "1: -> FLOCK ..." and are not holders.
		f := strings.Fields(sc.Text())
		if len(f) >= 6 && f[1] == "FLOCK" && f[5] == key {
			n, _ := strconv.Atoi(f[4])
			return n
		}
	}
	return 0
}

// Tracer is the leader-only tracer the lock consists of (of the anchor
// thread when the main thread has exited).
func (l *Lock) Tracer() *ptrace.Tracer { return l.t }

// Pid is the thread id every /proc path and ptrace request of the locked
// process names: its pid, or the anchor thread when its main thread has
// exited (its /proc/PID/mem and maps reach nothing).
func (l *Lock) Pid() int { return l.via }

// Release drops the lock (detaches, stopping nothing).
func (l *Lock) Release() {
	if l == nil {
		return
	}
	if l.t != nil {
		_ = l.t.Detach()
		l.t = nil
	}
	l.unflock()
}

// unflock drops the flock of a process whose main thread has exited,
// after the tracer let go.
func (l *Lock) unflock() {
	if l != nil && l.fd >= 0 {
		unix.Close(l.fd)
		l.fd = -1
	}
}

// tracerOf returns the TracerPid of pid (a thread id of the tracer), or 0.
func tracerOf(pid int) int { return max(procfs.TracerPid(pid, 0), 0) }

// describeTracer names a tracer thread by its process: "pid 4242 (hotpatch)".
func describeTracer(tid int) string {
	pid := tid
	if st, err := procfs.ReadStatus(tid, 0); err == nil {
		if n := st.Int("Tgid"); n > 0 {
			pid = n
		}
	}
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if name := strings.TrimSpace(string(comm)); name != "" {
		return fmt.Sprintf("pid %d (%s)", pid, name)
	}
	return fmt.Sprintf("pid %d", pid)
}

// Held reports, without taking anything, whether a hotpatch (or another
// tracer) holds pid: its leader is traced, or, when its main thread has
// exited, the flock of its /proc/PID/fd is held (D95; read from
// /proc/locks: taking and dropping it would make a hotpatch starting at
// that moment find it busy).
func Held(pid int) bool {
	if tracerOf(pid) > 0 {
		return true
	}
	if !procfs.LeaderExited(pid) {
		return false
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/fd", pid), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return true // unknown counts as held: nothing is called left on
	}
	defer unix.Close(fd)
	return flockHolder(fd) > 0
}
