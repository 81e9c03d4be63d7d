package ptrace

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
)

// Mem is /proc/PID/mem opened without tracing: the flip protocol's cheap
// path, which needs no stop at all. Writes to read-only text work where the
// kernel allows FOLL_FORCE writes by a ptrace-capable process (the default,
// proc_mem.force_override=always); on a kernel booted with
// proc_mem.force_override=ptrace they fail with EIO/EPERM and the caller
// must use Attach(pid, Options{LeaderOnly: true}), which seizes without
// stopping, instead. Both satisfy the same ReadMem/WriteMem methods.
type Mem struct {
	pid int
	fd  int
}

// OpenMem opens /proc/PID/mem for reading and writing.
func OpenMem(pid int) (*Mem, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("open memory of pid %d: %w", pid, ErrNoProcess)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/mem", pid), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		if _, serr := os.Stat(fmt.Sprintf("/proc/%d", pid)); serr != nil {
			return nil, fmt.Errorf("open memory of pid %d: %w", pid, ErrNoProcess)
		}
		if procfs.LeaderExited(pid) {
			return nil, fmt.Errorf("pid %d: %w", pid, ErrLeaderExited)
		}
		if err := procfs.Zombie(pid); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("open /proc/%d/mem: %w", pid, mapErrno(err))
	}
	return &Mem{pid: pid, fd: fd}, nil
}

// Pid is the process whose memory m is.
func (m *Mem) Pid() int { return m.pid }

// ReadMem reads len(b) bytes at addr.
func (m *Mem) ReadMem(addr uint64, b []byte) error { return readLarge(m.pid, m.fd, addr, b) }

// WriteMem writes b at addr with one pwrite (atomic only for one byte).
func (m *Mem) WriteMem(addr uint64, b []byte) error { return memWrite(m.fd, addr, b) }

// Close closes the file.
func (m *Mem) Close() error { return unix.Close(m.fd) }
