// Package elfscan finds the hook sites of an x86-64 executable or shared
// library and describes them as a probe list, for two providers: "cyg"
// (-finstrument-functions), every call or tail jump to
// __cyg_profile_func_enter, __cyg_profile_func_exit or
// __cyg_profile_func_enter_bare; and "fentry" (-pg -mfentry), the call to
// __fentry__ that is a function's first instruction (or follows its
// endbr64). Each can be switched off by rewriting its own bytes; the probe
// names the function it reports.
//
// fentry. A call to __fentry__ anywhere but a function's entry, a jump to
// it, and every reference to mcount/_mcount (-pg without -mfentry: the call
// follows the prologue) are reported, never listed. A fentry site is named
// by the function it begins and is always an entry probe. When gcc's
// -mrecord-mcount table __mcount_loc is present, Report.McountLoc compares
// it with the fentry sites found; a disagreement is reported, and the list
// holds what the decode found. The flags are dead at a function's entry by
// the ABI, so the nop placeholder is used for an fentry site only where the
// forward decode sees them read.
//
// The byte ranges it reports are rewritten in other people's programs, so it
// never guesses: anything it cannot vouch for is listed in Report.Skipped
// with the reason, and never becomes a probe.
//
// How sites are found. Function ranges come from .symtab, then .dynsym, then
// .eh_frame FDEs for code no symbol covers (a stripped shared library names
// only its exported functions in .dynsym). Each function is decoded linearly
// with x86dec. A branch reaches a hook directly (the hook is defined in the
// object), through a PLT entry (decoded to learn its GOT slot) or through a
// GOT slot; a slot is identified by its dynamic relocation's symbol, which
// survives stripping, or in a static executable by its contents. Only the
// five encodings of probelist have inert forms; other branches to a hook
// (conditional, rel8, prefixed, through a register) are reported. Sites
// already in their flip-inert form are recognised, so rescanning a cold
// binary gives its probe list back; nop-form call sites cannot be told from
// compiler padding and are not.
//
// Naming. The hook's first argument is recovered by walking back over every
// path to the site (fall-through and recorded branches) to a definition of
// rdi: a rip-relative lea, an immediate, a GOT load, or a copy from a register
// that is then followed, across calls only if callee-saved. All paths must
// agree and the value must be a function start, else the probe is marked
// unresolved. Block starts that nothing is seen to reach (indirect-jump
// targets, landing pads) end the walk unresolved; alignment padding after a
// jump or return is treated as unreachable.
//
// Placeholders. The flip form of a call site is a cmp, which writes the
// flags. A compiler that could not see the hook's body keeps no flags live
// across the call, but one that could (same unit, LTO, a hook defined in the
// object) might, so each call site's successors are decoded forward; a flag
// read before all flags are written, or an undecidable path when the hook is
// defined in the object, or DWARF showing the hook in the site's unit or an
// LTO build, selects the nop placeholder for that site.
//
// Limitations. A stripped static executable names no hook, so nothing is
// found (ErrNoHookSites). glibc's static hooks are one empty function with
// both names, so entry and exit sites cannot be told apart and are all
// reported, not listed. Section headers are required. Hook arguments that
// pass through memory, or that name a function of another object, are
// unresolved.
package elfscan
