// Package inject loads the edgeprobe runtime into a running process that
// maps instrumented code but was not started with the runtime, and routes
// the compiler hooks' bindings (__cyg_profile_func_enter/_exit/_enter_bare,
// __fentry__) of every mapped object to it.
//
// Inspect reads what the process is (seccomp, static or dynamic, its loader,
// libc's entry points, each object's hook GOT slots and where they point)
// without changing anything; the refusals of docs/injection.md are decided
// from it. Load borrows one thread at a safe point (ptrace.Borrow: its
// registers and extended state saved and restored exactly, an interrupted
// system call restarted), and makes it map two small areas, create a memfd
// for the runtime's bytes and start one new thread; that thread dlopens the
// runtime from /proc/thread-self/fd/N (so the target's mount namespace does not
// matter) and stores each hook slot with one aligned 8-byte store executed
// in the target, then ends. The borrowed thread is back at its own work
// before the dlopen begins. docs/injection.md has the safety arguments.
package inject
