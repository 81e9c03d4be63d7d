package ptrace

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// ntX86Xstate is the regset of the XSAVE area (x87, SSE, AVX, AVX-512, ...).
const ntX86Xstate = 0x202

// getXstate reads a stopped thread's extended state (PTRACE_GETREGSET
// NT_X86_XSTATE) into a buffer as large as the kernel says it is.
func getXstate(tid int) ([]byte, error) {
	buf := make([]byte, 64<<10) // larger than any XSAVE layout (AMX: ~11 KiB)
	iov := unix.Iovec{Base: &buf[0]}
	iov.SetLen(len(buf))
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_GETREGSET, uintptr(tid), ntX86Xstate, uintptr(unsafe.Pointer(&iov)), 0, 0)
	if e != 0 {
		return nil, e
	}
	return buf[:iov.Len], nil
}

// setXstate writes back what getXstate read.
func setXstate(tid int, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	iov := unix.Iovec{Base: &b[0]}
	iov.SetLen(len(b))
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SETREGSET, uintptr(tid), ntX86Xstate, uintptr(unsafe.Pointer(&iov)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// setSiginfo issues PTRACE_SETSIGINFO: the signal a tracee resumes with
// carries this information (sender, code) instead of the current stop's.
func setSiginfo(tid int, si *siginfo) error {
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SETSIGINFO, uintptr(tid), 0, uintptr(unsafe.Pointer(si)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// PTRACE_GETSIGMASK / PTRACE_SETSIGMASK (Linux 3.11): a stopped tracee's
// blocked-signal mask.
const (
	ptraceGetSigmask = 0x420a
	ptraceSetSigmask = 0x420b
)

func getSigmask(tid int) (uint64, error) {
	var m uint64
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, ptraceGetSigmask, uintptr(tid), 8, uintptr(unsafe.Pointer(&m)), 0, 0)
	if e != 0 {
		return 0, e
	}
	return m, nil
}

func setSigmask(tid int, m uint64) error {
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, ptraceSetSigmask, uintptr(tid), 8, uintptr(unsafe.Pointer(&m)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// PTRACE_GET_SYSCALL_INFO (Linux 5.3): what kind of system-call stop a
// tracee is in.
const (
	ptraceGetSyscallInfo = 0x420e
	syscallInfoEntry     = 1
	syscallInfoExit      = 2
)

// syscallStopOp returns the op of a system-call stop (syscallInfoEntry,
// syscallInfoExit), 0 if the tracee is in no system-call stop.
func syscallStopOp(tid int) (int, error) {
	var info [88]byte // struct ptrace_syscall_info; op is its first byte
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, ptraceGetSyscallInfo, uintptr(tid), uintptr(len(info)), uintptr(unsafe.Pointer(&info[0])), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(info[0]), nil
}
