// Package dwarfargs says, from an object's DWARF, where each argument and
// the return value of a probed function are when its entry probe and its
// return run, so a capture can record their registers and print
// handle_request(req=0x7f3a.., len=512) = 0.
//
// For each function with code (a DW_TAG_subprogram with an address) it
// gives the formal parameters in declaration order with their C types and
// locations at the function's first instruction (an integer argument
// register, an SSE register, bytes of the caller's stack arguments, a mix of
// these for a struct passed in registers, or "not recordable" with the
// reason), and the return value's location at the return. Locations come
// from the System V x86-64 calling convention applied to the DWARF types,
// checked against the DWARF location expressions where the compiler gives
// one for the entry address; where the compiler changed the convention
// (gcc's .isra/.constprop clones, clang's dead-argument elimination) only
// DWARF's own entry locations are trusted, and what it does not locate is
// reported as not recordable rather than guessed.
//
// Plan turns a signature into what a runtime must copy (which registers,
// how many stack bytes, which pointers to copy as bounded strings), and
// Decode turns what it copied (Regs) back into typed calltrace.Values.
// docs/tracing.md lists what cannot be recorded, and why.
package dwarfargs
