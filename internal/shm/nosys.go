package shm

import (
	"sync/atomic"
	"unsafe"
)

var hdrNosys = uint64(unsafe.Offsetof(Header{}.Nosys))

// SetNosys tells the runtime that a thread of the process runs under
// seccomp (D56): from the next hook on, the hooks make no system call
// (string copies, the busy word's and the shadow stack's rare checks, a
// new thread's claim, region set-up in a fork child) and decide without
// them. It cannot be undone: a filter cannot be removed either.
func (r *Region) SetNosys() error {
	if !r.writable {
		return r.readOnly()
	}
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&r.mem[hdrNosys])), 1)
	return nil
}

// Nosys reports whether the runtime was told (or found) that the process
// runs under seccomp.
func (r *Region) Nosys() bool { return r.u32(hdrNosys) != 0 }
