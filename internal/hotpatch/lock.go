package hotpatch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

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
type Lock struct{ t *ptrace.Tracer }

// AcquireLock takes the lock for pid; with wait it polls until the holder
// lets go, without it a held lock is ErrBusy naming the holder.
func AcquireLock(pid int, wait bool) (*Lock, error) {
	return AcquireLockContext(context.Background(), pid, wait)
}

// AcquireLockContext is AcquireLock whose wait ends when ctx does.
func AcquireLockContext(ctx context.Context, pid int, wait bool) (*Lock, error) {
	for {
		t, err := ptrace.Attach(pid, ptrace.Options{LeaderOnly: true, KillAtTrap: os.Getenv(EnvTestKillAt) == "trap-reaped"})
		if err == nil {
			return &Lock{t: t}, nil
		}
		if !errors.Is(err, ptrace.ErrTraced) {
			return nil, err // a real permission problem, or no process
		}
		holder := tracerOf(pid)
		if holder <= 0 {
			continue // it let go between our attempt and our look: try again
		}
		if !wait {
			return nil, fmt.Errorf("pid %d is traced by %s: %w (use --wait to queue behind it)", pid, describeTracer(holder), ErrBusy)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %s to let go of pid %d: %w", describeTracer(holder), pid, ctx.Err())
		case <-time.After(10 * time.Millisecond): // polling the holder: there is no event for a detach
		}
	}
}

// Tracer is the leader-only tracer the lock consists of.
func (l *Lock) Tracer() *ptrace.Tracer { return l.t }

// Release drops the lock (detaches, stopping nothing).
func (l *Lock) Release() {
	if l == nil || l.t == nil {
		return
	}
	_ = l.t.Detach()
	l.t = nil
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
