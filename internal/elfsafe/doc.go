// Package elfsafe opens ELF files that another user may have written (the
// objects a process maps, which hotpatch reads as root) without letting
// their section headers make a reader produce far more than the file
// holds. debug/elf inflates a compressed section (SHF_COMPRESSED, or the
// older .zdebug form) to the size its header declares: a megabyte of zlib
// declares a gigabyte, and a file can point many section headers at it.
// NewFile refuses what no toolchain writes and what inflates past
// MaxInflate times its bytes (ErrInflated), before any section is read
// (D84). Extent says how much of a file its ELF headers describe, so that
// a tail nothing describes (gigabytes of holes after a program's ELF cost
// its owner nothing) is never read, and refuses an object describing more
// than MaxObjectBytes (ErrTooLarge); ReadObject reads that much (D88).
package elfsafe
