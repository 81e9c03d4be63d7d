package inject

import "errors"

// Sentinel errors: each refusal leaves the process unchanged.
var (
	// ErrSeccomp: the process runs under a seccomp filter or strict mode,
	// which may kill it for a system call the load needs.
	ErrSeccomp = errors.New("process runs under seccomp")
	// ErrStatic: the program is statically linked; there is no loader to
	// load a library with.
	ErrStatic = errors.New("statically linked program")
	// ErrNoLoader: a dynamic program whose dlopen/pthread_create cannot be
	// found in any mapped object.
	ErrNoLoader = errors.New("no dlopen in the process")
	// ErrUntrusted: the runtime file may have been written by someone other
	// than root or the target's owner.
	ErrUntrusted = errors.New("runtime file is not trusted")
	// ErrNoSafeThread: every try found each thread inside the allocator,
	// the loader or a lock wait.
	ErrNoSafeThread = errors.New("no thread at a safe point")
	// ErrLoad: the runtime could not be loaded (dlopen's message follows).
	ErrLoad = errors.New("loading the runtime failed")
	// ErrStopped: the process is stopped (SIGSTOP, Ctrl-Z): no thread can
	// be borrowed until it is continued.
	ErrStopped = errors.New("process is stopped")
	// ErrNotRuntime: the file given as runtime does not define the hooks.
	ErrNotRuntime = errors.New("not an edgeprobe runtime")
	// ErrMemfdReplaced: the descriptor the load's memfd_create returned no
	// longer holds that memfd when hotpatch comes to fill it (the program
	// put another file in its place); nothing was written.
	ErrMemfdReplaced = errors.New("the runtime's memfd was replaced by the program")
)
