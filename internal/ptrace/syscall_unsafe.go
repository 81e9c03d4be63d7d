package ptrace

import (
	"encoding/binary"
	"unsafe"

	"golang.org/x/sys/unix"
)

// seize issues PTRACE_SEIZE with options, which unix.PtraceSeize cannot pass.
func seize(tid int, options uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(tid), 0, options, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// siginfo is the head of the kernel's siginfo_t; the rest is padding.
type siginfo struct {
	Signo int32
	Errno int32
	Code  int32
	_     [128 - 12]byte
}

// bytes is the siginfo as the kernel lays it out.
func (si *siginfo) bytes() []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(si)), unsafe.Sizeof(*si))
}

// getSiginfo returns the siginfo of the signal a tracee is stopped for.
func getSiginfo(tid int) (siginfo, error) {
	var si siginfo
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_GETSIGINFO, uintptr(tid), 0, uintptr(unsafe.Pointer(&si)), 0, 0)
	if e != 0 {
		return si, e
	}
	return si, nil
}

// peekWait returns the next event of the calling thread's tracees without
// consuming it (waitid with WNOWAIT): its pid, si_code (CLD_*) and
// si_status (for a ptrace-stop, the stop's code: the signal, | event << 8).
// pid is 0 when there is none; err is waitid's (ECHILD: no tracee left).
func peekWait() (pid int, code, status int32, err error) {
	var si siginfo
	opts := unix.WEXITED | unix.WSTOPPED | unix.WNOHANG | unix.WNOWAIT | unix.WALL | unix.WNOTHREAD
	_, _, e := unix.Syscall6(unix.SYS_WAITID, unix.P_ALL, 0, uintptr(unsafe.Pointer(&si)), uintptr(opts), 0, 0)
	if e != 0 {
		return 0, 0, 0, e
	}
	b := si.bytes()
	pid = int(int32(binary.LittleEndian.Uint32(b[16:20])))
	if pid <= 0 {
		return 0, 0, 0, nil
	}
	return pid, si.Code, int32(binary.LittleEndian.Uint32(b[24:28])), nil
}

// listen issues PTRACE_LISTEN: a group-stopped tracee stays stopped, but we
// are told when it leaves the stop.
func listen(tid int) error {
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_LISTEN, uintptr(tid), 0, 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// detach issues PTRACE_DETACH, delivering sig (0 for none) as the tracee resumes.
func detach(tid, sig int) error {
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_DETACH, uintptr(tid), 0, uintptr(sig), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// vmRead reads len(b) bytes at addr of pid with one process_vm_readv and
// returns how many it read (fewer at a gap in the mapping).
func vmRead(pid int, addr uint64, b []byte) (int, error) {
	local := []unix.Iovec{{Base: &b[0], Len: uint64(len(b))}}
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(b)}}
	return unix.ProcessVMReadv(pid, local, remote, 0)
}

// sameVM reports whether two processes share one address space
// (kcmp KCMP_VM): a vfork child shares its parent's.
func sameVM(pid1, pid2 int) bool {
	const kcmpVM = 1
	r, _, e := unix.Syscall6(unix.SYS_KCMP, uintptr(pid1), uintptr(pid2), kcmpVM, 0, 0, 0)
	return e == 0 && r == 0
}
