package ptrace

import (
	"errors"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
)

var (
	// ErrNoProcess: the pid names no process (or a kernel thread). It is
	// procfs.ErrNoProcess, the one every package wraps.
	ErrNoProcess = procfs.ErrNoProcess
	// ErrLeaderExited: the process's main thread has exited while other
	// threads run on (procfs.ErrLeaderExited): it cannot be attached.
	ErrLeaderExited = procfs.ErrLeaderExited
	// ErrPermission: the kernel refused to let us trace or write the target.
	ErrPermission = errors.New("permission denied")
	// ErrExited: the target exited while we worked on it.
	ErrExited = errors.New("target process exited")
	// ErrExec: the target called execve; its old code is gone and no further
	// write is made.
	ErrExec = errors.New("target process called execve")
	// ErrDetached: the tracer was detached; no further request is served.
	ErrDetached = errors.New("tracer is detached")
	// ErrTraced: the thread already has a tracer (another hotpatch, gdb,
	// strace); wrapped together with ErrPermission.
	ErrTraced = errors.New("already traced")
	// ErrNotLent: a ThreadMem was used after the DoMem call that lent it
	// returned (it is valid only inside that call, on the tracer thread).
	ErrNotLent = errors.New("tracer memory used outside its DoMem")
	// ErrArmed: Detach was called while a trap address is still armed.
	ErrArmed = errors.New("trap addresses still armed")
	// ErrWrongThread: a request to a tracer served inline on a Run thread
	// came from another goroutine (only that thread may make them).
	ErrWrongThread = errors.New("tracer used from another thread")
)
