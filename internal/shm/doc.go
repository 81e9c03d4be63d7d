// Package shm reads the shared-memory region the edgeprobe runtime
// (runtime/*.c, preloaded as bin/libedgeprobe.so) keeps per process:
// an anonymous memfd while the process runs (OpenPID finds it through
// /proc/PID/fd and checks whom it belongs to: ErrNoRuntime, ErrUntrusted),
// or the file named by EDGEPROBE_OUTPUT after it exits. Both have the same
// bytes, so one reader serves `hotpatch stats` live and offline.
//
// The layout is defined once, in runtime/edgeprobe_shm.h; the Go structs in
// layout.go mirror it field for field and TestLayoutMatchesC compiles a C
// program against the header to check every offset and size. Open verifies
// the magic, version and geometry before anything is read (errors wrap
// ErrTruncated, ErrBadMagic, ErrVersion or ErrLayout and say which field), so
// a corrupt or foreign file is an error, never a panic or an out-of-range read.
//
// Counters are read with atomic loads while the process keeps writing them:
// a snapshot is consistent per counter, not across counters (an exit may be
// seen without its entry). A function's totals are its shared table entry
// plus the per-thread cache entries that name it (see docs/runtime.md).
//
// The function table grows while the process runs, in segments reserved as
// address space (decision D35): readers take the segments in use from the
// header at each read (FuncSlots) and probe a key's windows segment by
// segment as the runtime does. Most of a region is reserve no page of which
// was written, and reading such a page through the shared mapping would make
// the kernel allocate it, so scans read only what the file says holds data
// (extents.go); ReadMemory reports what a process's region costs.
//
// Trace rings are single-producer rings with a head the runtime advances and
// a tail only a consuming reader advances: Consume reads and frees events
// (one consumer at a time), Events copies them without freeing. Control flags
// (trace on/off, count-only, pause) are set with SetControl on a writable
// mapping.
//
// Latency percentiles come from a log2 histogram and have bucket resolution:
// Percentile returns the upper bound of the bucket holding the rank, clamped
// to the observed min and max, so the true value lies within a factor of two
// below it.
package shm
