// Package ptrace is edgeprobe's tracer: one goroutine locked to one OS thread
// that issues every ptrace request and every /proc/PID/mem read and write for
// one target process, so the kernel's ptrace ownership rules (requests only
// from the tracer thread; with proc_mem.force_override=ptrace, text writes
// only from the tracer) always hold. Inside Run, the first tracer attached is
// served by the goroutine that attached it, on Run's own locked thread,
// without a tracer goroutine (a one-shot request: no hand-off per request).
//
// Attach seizes every thread of the target (PTRACE_SEIZE does not stop it)
// with PTRACE_O_TRACECLONE, so threads born later arrive as clone events, and
// PTRACE_O_TRACEEXEC, so an exec is noticed and later writes are refused
// instead of landing in the new program image. While attached, the server
// loop reaps ptrace events and gives every stop its ordinary outcome: signals
// are re-injected unchanged, group-stops are kept with PTRACE_LISTEN, new
// threads are resumed, so a traced process behaves as an untraced one.
//
// The int3 protocols of package xmod arm trap addresses: a thread that hits
// int3 at an armed address is held in its SIGTRAP stop until the site is
// complete, then resumed at the site. A trap at an address that was armed
// once but is no longer (a stale int3 still seen by another core) is
// rewound and resumed at once. Detach stops every thread once before
// detaching it, so no thread can still see a stale int3 afterwards, and it
// refuses while any address is armed.
//
// Raw system calls live in syscall_unsafe.go only; errors wrap the sentinel
// values below for errors.Is.
package ptrace
