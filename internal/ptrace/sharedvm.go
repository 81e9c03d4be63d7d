package ptrace

import (
	"os"
	"sort"
	"strconv"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
)

// VMSharers returns the other processes that share pid's address space:
// children (or parents) made by clone with CLONE_VM and without
// CLONE_THREAD, which run the same text as separate processes. A tracer
// of pid holds none of their threads: an int3 it arms kills them (no one
// catches their SIGTRAP), and a protocol that stops the world to rewrite
// whole sites does not stop them. vfork children waiting to exec are
// included. It looks at every process it may compare with kcmp(2);
// without kcmp it finds none.
func VMSharers(pid int) []int {
	// kcmp compares the tasks' mm, and a task that has none (a zombie
	// main thread, a kernel thread) equals every other that has none:
	// compare through a live thread of pid, whose mm is the process's.
	ref := liveTask(pid)
	if ref <= 0 {
		return nil
	}
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil
	}
	var out []int
	for _, n := range names {
		p, err := strconv.Atoi(n)
		if err != nil || p == pid || p <= 0 {
			continue
		}
		// A match with no memory is a kernel thread matching a ref that
		// lost its mm while exiting, not yet a zombie (the main thread of
		// a process whose other threads run on, mid-pthread_exit: D95).
		if sameVM(ref, p) && procfs.HasMemory(p) {
			out = append(out, p)
		}
	}
	sort.Ints(out)
	return out
}

// liveTask is pid, or while its main thread is a zombie one of its live
// threads; 0 if none is left.
func liveTask(pid int) int {
	if st, err := procfs.ReadStat(pid, 0); err == nil && st.State != 'Z' && st.State != 'X' {
		return pid
	}
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return 0
	}
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil || tid == pid {
			continue
		}
		if st, err := procfs.ReadStat(pid, tid); err == nil && st.State != 'Z' && st.State != 'X' {
			return tid
		}
	}
	return 0
}

// UntracedVMSharers is VMSharers less the processes the tracer traces as
// threads (vfork children, and clone(CLONE_VM) children made while it
// traced every thread: firstStop) or holds at their first stop.
func (t *Tracer) UntracedVMSharers() []int {
	all := VMSharers(t.pid)
	if len(all) == 0 {
		return nil
	}
	var out []int
	_ = t.Do(func() error {
		t.pump()
		for _, p := range all {
			_, thread := t.threads[p]
			_, born := t.kids[p] // announced, first stop to come: held till then
			if !thread && !born && !t.early[p] {
				out = append(out, p)
			}
		}
		return nil
	})
	return out
}
