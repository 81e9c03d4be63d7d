// Package xmod cross-modifies the code of a running multi-threaded process
// through /proc/PID/mem while its threads keep running: the protocols that
// toggle probe sites between their active and inert forms without any thread
// ever executing a torn instruction.
//
//   - Flip: sites whose forms differ in exactly one byte; one atomic byte
//     store each, no stop, no wait. Works on a plain Mem (ptrace.OpenMem).
//     With FlipOptions.Pristine, runs of sites in text nobody else has
//     written are written as checked spans, read back (span.go).
//     Prepared (prepared.go) is a batch checked and sorted once, for
//     callers that apply it again and again: its Classify reads it, and
//     its Flip writes from the states the caller's Classify just found.
//     Asked to (KeepImages), it keeps its last read with the states found
//     in it and its spans as checked and as written, and uses them when
//     the bytes read are the same (spanimage.go, D61).
//   - Int3: any sites; the text_poke_bp order (int3 on byte 0, barrier,
//     bytes 1..n-1, barrier, byte 0), threads that trap are held by the
//     tracer. Each barrier is a time wait plus a per-thread serialisation
//     (every thread passes through the kernel) unless NoSync.
//   - Async: the same, split into Start and Finish for many outstanding
//     patches (the paper's Figs. 6-7).
//   - Stop: the stop-the-world baseline.
//
// Every protocol reads each site first and refuses, before writing anything,
// a site that holds neither of its forms (*SiteError, ErrUnexpectedBytes).
// docs/protocols.md gives each protocol's safety argument and the failure
// and interruption handling.
package xmod
