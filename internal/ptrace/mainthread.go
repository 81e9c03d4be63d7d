package ptrace

import "runtime"

// The main goroutine keeps the main thread. A tracer goroutine that ran on
// the main thread could not end it (Go parks the main thread instead of
// exiting it), so the kernel would never detach what it still traces: the
// leader-only mode's detach relies on the tracer thread exiting.
func init() { runtime.LockOSThread() }
