package ptrace

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
)

// seizeVforkChildren seizes the vfork children that exist when we attach.
// A child that a thread vforked before we seized that thread is not
// auto-attached (only children made by a traced thread are), is not in
// /proc/PID/task (it is a process of its own) and shares our text: left
// untraced it dies of SIGTRAP at the first int3 a batch writes
// (docs/protocols.md "Forks"). Children made after the scan
// come through the event loop; a child found here is traced like every
// vfork child, as one more thread, and its parent thread is marked as
// blocked in vfork (markVfork). A vfork child that itself sits blocked in
// vfork has a child of its own sharing the text (a vfork of a vfork: its
// PPid is that child, not the target): the scan goes on one generation
// down until a pass finds nobody new. Called once every thread is seized,
// so no untraced thread is left to vfork another one, and before any
// event is pumped.
func (t *Tracer) seizeVforkChildren() error {
	// A vfork child lives only while its parent thread is blocked in
	// vfork: with no such thread (the common case) there is nothing to
	// scan /proc for.
	parents := map[int]bool{}
	for _, th := range t.threads {
		if t.blockedInVfork(t.pid, th.tid) {
			t.markVfork(th)
			parents[t.pid] = true
		}
	}
	for len(parents) > 0 {
		ents, err := os.ReadDir("/proc")
		if err != nil {
			return fmt.Errorf("attach to pid %d: %w", t.pid, err)
		}
		next := map[int]bool{}
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == t.pid {
				continue
			}
			if _, ok := t.threads[pid]; ok {
				continue
			}
			st, err := procfs.ReadStatus(pid, 0)
			if err != nil || !parents[st.Int("PPid")] || st.Int("Tgid") != pid || !sameVM(t.pid, pid) {
				continue // not a child of ours, or a forked one: its own copy of the text
			}
			switch err := seize(pid, fullOptions); {
			case err == nil:
			case err == unix.ESRCH || procfs.Gone(pid, 0):
				continue // exited (or execed and exited) meanwhile
			case err == unix.EPERM && tracerOf(pid) == t.tid:
				continue // auto-attached: made by a seized thread; the event loop has it
			default:
				return fmt.Errorf("vfork child %d: %w", pid, attachErr(pid, err))
			}
			// If it execs meanwhile, its exec event detaches it (handle).
			th := &thread{tid: pid, announced: true}
			t.threads[pid] = th
			t.stats.Vforks++
			if t.blockedInVfork(pid, pid) {
				t.markVfork(th)
				next[pid] = true
			}
		}
		parents = next
	}
	return nil
}

// markVfork marks a thread found blocked in vfork at attach, so that
// Sync, StopAll and Detach do not wait for it: it stays in the kernel
// until its child execs or exits. The mark must not outlive the vfork,
// and /proc only showed the thread inside the system call: a clone with
// CLONE_VFORK that sleeps before its child exists (reclaim, a cgroup lock,
// a fault on its arguments) and then fails has no VFORK_DONE to clear the
// mark, and the thread would run on unheld through every StopAll. So the
// thread is also interrupted: a thread truly waiting for its vfork child
// sleeps killable, ignores the interrupt until the vfork ends and stops
// after its VFORK_DONE event; one still before the child (or whose clone
// failed) stops at once, its clone restarted if it was cut short
// (ERESTARTNOINTR, and it is traced now, so the restarted vfork reports its
// events). Either stop clears the mark (handle).
func (t *Tracer) markVfork(th *thread) {
	th.inVfork = true
	_ = unix.PtraceInterrupt(th.tid) // ESRCH: gone; its exit comes through wait4
}

// blockedInVfork reports whether a thread (of the thread group tgid: the
// target, or a vfork child of it) sits in vfork, or in clone or
// clone3 with CLONE_VFORK, from /proc/PID/task/TID/syscall ("nr arg1 ..."
// for a blocked thread, "running" otherwise).
func (t *Tracer) blockedInVfork(tgid, tid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/syscall", tgid, tid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return false
	}
	nr, err := strconv.Atoi(f[0])
	if err != nil {
		return false
	}
	arg, err := strconv.ParseUint(strings.TrimPrefix(f[1], "0x"), 16, 64)
	if err != nil {
		return false
	}
	switch nr {
	case unix.SYS_VFORK:
		return true
	case unix.SYS_CLONE:
		return arg&unix.CLONE_VFORK != 0
	case unix.SYS_CLONE3:
		var flags [8]byte // struct clone_args starts with the u64 flags
		if t.mem < 0 || memRead(t.mem, arg, flags[:]) != nil {
			return false
		}
		v := uint64(0)
		for i := 7; i >= 0; i-- {
			v = v<<8 | uint64(flags[i])
		}
		return v&unix.CLONE_VFORK != 0
	}
	return false
}
