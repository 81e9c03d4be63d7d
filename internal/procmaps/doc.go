// Package procmaps reads /proc/PID/maps and, for every mapped ELF object,
// finds what the live patcher needs to turn ELF virtual addresses into run-time
// addresses: the load bias, the build-id, and the executable ranges.
//
// The ELF headers are read from the mapping itself, through
// /proc/PID/map_files/<start>-<end> (the very file the process mapped, even if
// it was deleted or replaced on disk since, or lives in another mount
// namespace), falling back to /proc/PID/root/<path>. A probe list must only be
// applied to an object whose build-id (or, lacking one, size) matches.
//
// ExecFiles gives only the executable file mappings, asking the kernel for
// each (the PROCMAP_QUERY ioctl) instead of parsing every line: a flip
// batch's pristine check reads them twice (D62).
package procmaps
