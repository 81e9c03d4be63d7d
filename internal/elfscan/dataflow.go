package elfscan

import (
	"fmt"
	"slices"

	"golang.org/x/arch/x86/x86asm"

	"github.com/edgeprobe/edgeprobe/internal/x86dec"
)

// value is what a register is known to hold: an address, or the contents
// of the GOT slot at addr.
type value struct {
	addr uint64
	slot bool
}

// walkLimit bounds the backward search; the definitions the compilers emit
// for hook arguments are a few instructions back, or hoisted to the prologue.
const walkLimit = 512

// valueBefore recovers the value register family fam holds just before
// instruction idx executes. It walks back over every predecessor (the
// fall-through and each branch to an instruction) until each path reaches a
// definition it understands; all paths must agree. Caller-saved registers do
// not survive a call on the path; callee-saved ones do. Reaching the function
// entry, an instruction nothing is known to reach, or any other write to the
// register fails the walk.
func (fa *funcAnalysis) valueBefore(idx, fam int) (value, bool) {
	type state struct {
		k, fam int
		trunc  bool // the value passed through a 32-bit move, so it must fit in 32 bits
	}
	var found *value
	var seen []state // walks are short: a slice beats a map
	work := []state{{idx, fam, false}}
	for steps := 0; len(work) > 0; steps++ {
		if steps > walkLimit {
			return value{}, false
		}
		st := work[len(work)-1]
		work = work[:len(work)-1]
		if slices.Contains(seen, st) {
			continue
		}
		seen = append(seen, st)
		preds := fa.jumpers[st.k]
		if st.k == 0 {
			return value{}, false // the incoming argument
		}
		if !noFallthrough(fa.insns[st.k-1].in) {
			preds = append(preds[:len(preds):len(preds)], st.k-1)
		}
		if len(preds) == 0 {
			if isPadding(fa.insns[st.k].in) && noFallthrough(fa.insns[st.k-1].in) {
				continue // alignment padding after a jump or return: a dead path
			}
			return value{}, false // reached only by a jump we cannot see
		}
		for _, p := range preds {
			x := &fa.insns[p]
			if x.callLike && !calleeSaved(st.fam) {
				return value{}, false
			}
			if !mayWrite(x.in, st.fam) {
				work = append(work, state{p, st.fam, st.trunc})
				continue
			}
			v, next, trunc, ok := definition(x, st.fam)
			if !ok {
				return value{}, false
			}
			if next != noFamily {
				work = append(work, state{p, next, st.trunc || trunc})
				continue
			}
			if (st.trunc || trunc) && v.addr > 0xffffffff {
				return value{}, false
			}
			if found != nil && *found != v {
				return value{}, false
			}
			found = &v
		}
	}
	if found == nil {
		return value{}, false
	}
	return *found, true
}

// definition interprets an instruction that writes family fam: a constant
// address (lea rip-relative, mov immediate), a GOT load (mov from
// [rip+d]), or a copy from another register (next names its family).
func definition(x *insn, fam int) (v value, next int, trunc bool, ok bool) {
	in := x.in
	dst, _ := in.Args[0].(x86asm.Reg)
	wide := dst >= x86asm.RAX && dst <= x86asm.R15
	narrow := dst >= x86asm.EAX && dst <= x86asm.R15L
	if in.Kind != x86dec.KindX86asm || !wide && !narrow || in.Args[2] != nil {
		return value{}, noFamily, false, false
	}
	switch in.Op {
	case x86asm.LEA:
		if t, isRip := ripTarget(in, x.addr); isRip && wide {
			return value{addr: t}, noFamily, false, true
		}
	case x86asm.MOV:
		switch src := in.Args[1].(type) {
		case x86asm.Imm:
			if narrow {
				return value{addr: uint64(uint32(src))}, noFamily, false, true
			}
			return value{addr: uint64(src)}, noFamily, false, true
		case x86asm.Mem:
			if t, isRip := ripTarget(in, x.addr); isRip && wide && in.MemBytes == 8 {
				return value{addr: t, slot: true}, noFamily, false, true
			}
		case x86asm.Reg:
			if wide && src >= x86asm.RAX && src <= x86asm.R15 || narrow && src >= x86asm.EAX && src <= x86asm.R15L {
				return value{}, family(src), narrow, true
			}
		}
	}
	return value{}, noFamily, false, false
}

type flagState int

const (
	flagsDead flagState = iota
	flagsLive
	flagsUnknown
)

// flagsLimit is how far flagsAfter looks before it gives up.
const flagsLimit = 64

// flagsAfter decides whether the status flags are live after the site at
// instruction idx: whether, on the path that follows it, an instruction reads
// a flag before one overwrites them all. The ABI lets a call clobber the
// flags, so a compiler that could not see the hook's body keeps none live
// across it; the flip form of a call site (a cmp) writes the flags, which is
// only safe when nothing reads them. A call or return on the path ends the
// search (dead by the ABI); unconditional jumps are followed. The reason
// string says what decided a live or unknown answer.
func (fa *funcAnalysis) flagsAfter(idx int) (flagState, string) {
	var seen []int
	j := idx + 1
	for steps := 0; steps < flagsLimit; steps++ {
		if j >= len(fa.insns) {
			return flagsUnknown, "the decode ends before the flags are overwritten"
		}
		if slices.Contains(seen, j) {
			return flagsDead, "" // a loop with no reader in it
		}
		seen = append(seen, j)
		x := &fa.insns[j]
		in := x.in
		switch {
		case readsFlags(in):
			return flagsLive, fmt.Sprintf("%s at %#x reads the flags", in, x.addr)
		case writesAllFlags(in), x.callLike:
			return flagsDead, ""
		case in.Kind != x86dec.KindX86asm:
		case in.Op == x86asm.RET || in.Op == x86asm.UD2 || in.Op == x86asm.HLT:
			return flagsDead, ""
		case in.Op == x86asm.JMP:
			t, ok := relTarget(in, x.addr)
			if !ok {
				if _, got := ripTarget(in, x.addr); got {
					return flagsDead, "" // tail call through the GOT
				}
				return flagsUnknown, fmt.Sprintf("the indirect jump at %#x cannot be followed", x.addr)
			}
			if t >= fa.fn.start && t < fa.fn.end {
				if j = fa.index(t); j < 0 {
					return flagsUnknown, fmt.Sprintf("the jump at %#x lands inside an instruction", x.addr)
				}
				continue
			}
			if _, plt := fa.o.plt[t]; plt || fa.o.funcStarts[t] {
				return flagsDead, "" // tail call
			}
			return flagsUnknown, fmt.Sprintf("the jump at %#x leaves the function for %#x", x.addr, t)
		}
		j++
	}
	return flagsUnknown, fmt.Sprintf("no instruction overwrites the flags within %d instructions", flagsLimit)
}
