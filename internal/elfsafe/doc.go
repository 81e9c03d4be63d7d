// Package elfsafe opens ELF files that another user may have written (the
// objects a process maps, which hotpatch reads as root) without letting
// their section headers make a reader produce far more than the file
// holds. debug/elf inflates a compressed section (SHF_COMPRESSED, or the
// older .zdebug form) to the size its header declares: a megabyte of zlib
// declares a gigabyte, and a file can point many section headers at it.
// NewFile refuses what no toolchain writes and what inflates past
// MaxInflate times its bytes (ErrInflated), before any section is read
// (D84).
package elfsafe
