package elfscan

import (
	"debug/elf"
	"encoding/binary"
	"fmt"
	"sort"

	"golang.org/x/arch/x86/x86asm"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/x86dec"
)

// insn is one instruction of a function's linear decode.
type insn struct {
	addr     uint64
	in       x86dec.Inst
	raw      []byte
	callLike bool // a call, or a call site in its inert form: clobbers caller-saved registers
}

// site is a hook site found in a function.
type site struct {
	addr      uint64
	enc       string
	cur       []byte // the bytes as found
	inert     bool   // found in flip-inert form
	hook      hookRef
	idx       int // index in insns
	nopReason string
	fnAddr    uint64
	resolved  bool
}

// candidate is a flip-inert-looking call site, confirmed only once the whole
// function is decoded and the flags after it are known to be dead.
type candidate struct {
	site
}

type regUse struct {
	idx int
	reg x86asm.Reg
}

// funcAnalysis holds one function's decode and what was found in it.
type funcAnalysis struct {
	o          *object
	fn         function
	insns      []insn
	sites      []site
	candidates []candidate
	regCalls   []regUse
	skipped    []Skipped
	jumpers    map[int][]int // instruction index -> indexes of branches to it
	incomplete bool          // the decode stopped early
}

func (fa *funcAnalysis) skip(addr uint64, raw []byte, text, hook, reason string) {
	fa.skipped = append(fa.skipped, Skipped{
		Address: addr, Container: fa.fn.name, Instruction: fmt.Sprintf("%s (% x)", text, raw), Hook: hook, Reason: reason,
	})
}

// Why references to the profiling hooks are not sites.
const (
	mcountReason = "call to mcount (-pg without -mfentry): it follows the prologue and is not one of the sites edgeprobe " +
		"switches; build with -pg -mfentry"
	fentryJumpReason = "jump to __fentry__: an fentry site is a call at a function's entry"
)

func hookLabel(h hookRef) string {
	if h.hook != "" {
		return h.hook
	}
	return fmt.Sprint(h.ambiguous)
}

func ambiguousReason(h hookRef) string {
	return fmt.Sprintf("the hook at %#x is named %v: an entry site cannot be told from an exit site", h.hookAddr, h.ambiguous)
}

// analyze decodes fn linearly and collects its hook sites and the hook
// references that are not patchable sites.
func (o *object) analyze(fn function) (*funcAnalysis, *DecodeError) {
	fa := &funcAnalysis{o: o, fn: fn, insns: o.scratch[:0]}
	defer func() { o.scratch = fa.insns[:0] }() // reused: the next function needs no fresh, growing slice
	code, _, _ := o.bytesAt(fn.start, fn.end-fn.start, true)
	var derr *DecodeError
	if uint64(len(code)) < fn.end-fn.start {
		fa.incomplete = true
		derr = &DecodeError{Function: fn.name, Address: fn.start + uint64(len(code)), Err: "function extends past its executable segment"}
	}
	for pc := 0; pc < len(code); {
		addr := fn.start + uint64(pc)
		b := code[pc:]
		if b[0] == 0xc3 {
			if n := fa.inertJump(addr, b); n > 0 {
				pc += n
				continue
			}
		}
		in, err := x86dec.Decode(b)
		if err != nil {
			fa.incomplete = true
			derr = &DecodeError{Function: fn.name, Address: addr, Err: err.Error()}
			break
		}
		fa.insns = append(fa.insns, insn{addr: addr, in: in, raw: b[:in.Len], callLike: isCall(in)})
		fa.classify(len(fa.insns) - 1)
		pc += in.Len
	}
	if fa.linkBranches() {
		return fa, derr
	}
	for _, c := range fa.candidates {
		st, why := fa.flagsAfter(c.idx)
		// An fentry site sits at a function's entry, where the flags are
		// dead by the ABI whatever the decode after it shows; its position
		// is checked once the containing function is known.
		fentry := c.hook.provider() == probelist.ProviderFentry
		switch {
		case st == flagsLive || st == flagsUnknown && c.hook.direct && !fentry:
			fa.skip(c.addr, c.cur, fa.insns[c.idx].in.String(), hookLabel(c.hook),
				"has the flip-inert form of a hook call, but "+why+", so it is an ordinary comparison or a site no scan would have flipped")
		case len(c.hook.ambiguous) > 0:
			fa.skip(c.addr, c.cur, fa.insns[c.idx].in.String(), hookLabel(c.hook), "inert site: "+ambiguousReason(c.hook))
		default:
			fa.insns[c.idx].callLike = true
			fa.sites = append(fa.sites, c.site)
		}
	}
	sort.Slice(fa.sites, func(i, j int) bool { return fa.sites[i].addr < fa.sites[j].addr })
	for _, u := range fa.regCalls {
		fa.registerBranch(u)
	}
	for i := range fa.sites {
		s := &fa.sites[i]
		if s.hook.provider() == probelist.ProviderFentry {
			// Named by position (scan checks it is the function's entry).
			// The flags are dead at a function's entry by the ABI, so only
			// code seen reading them (not ABI-conforming) gets a nop.
			if !s.inert {
				if st, why := fa.flagsAfter(s.idx); st == flagsLive {
					s.nopReason = why
				}
			}
			continue
		}
		fa.name(s)
		if !s.inert && isCallEncoding(s.enc) {
			if st, why := fa.flagsAfter(s.idx); st == flagsLive || st == flagsUnknown && s.hook.direct {
				s.nopReason = why
			}
		}
	}
	return fa, derr
}

// inertJump recognises a tail-jump site in its inert form: a ret whose 4
// (jmp rel32) or 5 (jmp [rip+d]) dead bytes would reach a hook. It returns
// the number of bytes consumed, 0 if b is an ordinary ret.
func (fa *funcAnalysis) inertJump(addr uint64, b []byte) int {
	type form struct {
		enc string
		n   int
		h   hookRef
	}
	var forms []form
	// Only -finstrument-functions has tail-jump sites; a ret whose dead
	// bytes would reach __fentry__ or mcount is just a ret.
	tail := func(h hookRef) bool {
		return h.found() && h.provider() != probelist.ProviderFentry && h.provider() != providerMcount
	}
	if len(b) >= 5 {
		if h := fa.o.target(addr + 5 + uint64(int64(int32(binary.LittleEndian.Uint32(b[1:]))))); tail(h) {
			forms = append(forms, form{probelist.EncJmpRel32, 5, h})
		}
	}
	if len(b) >= 6 && b[1] == 0x25 {
		if h := fa.o.slot(addr + 6 + uint64(int64(int32(binary.LittleEndian.Uint32(b[2:]))))); tail(h) {
			forms = append(forms, form{probelist.EncJmpGOT, 6, h})
		}
	}
	switch len(forms) {
	case 0:
		return 0
	case 2:
		fa.skip(addr, b[:6], "ret", hookLabel(forms[0].h), "ret followed by bytes that read both as an inert jmp rel32 and an inert jmp [rip+d] site")
		return 0
	}
	f := forms[0]
	raw := b[:f.n]
	ret := x86dec.Inst{Inst: x86asm.Inst{Op: x86asm.RET, Mode: 64, Len: f.n}}
	fa.insns = append(fa.insns, insn{addr: addr, in: ret, raw: raw})
	if len(f.h.ambiguous) > 0 {
		fa.skip(addr, raw, "ret (inert jmp)", hookLabel(f.h), "inert site: "+ambiguousReason(f.h))
	} else {
		fa.sites = append(fa.sites, site{addr: addr, enc: f.enc, cur: raw, inert: true, hook: f.h, idx: len(fa.insns) - 1})
	}
	return f.n
}

// classify looks at instruction i for hook sites and hook references.
func (fa *funcAnalysis) classify(i int) {
	x := &fa.insns[i]
	in, raw, addr := x.in, x.raw, x.addr
	if in.Kind != x86dec.KindX86asm {
		return
	}
	newSite := func(enc string, h hookRef, inert bool) {
		switch {
		case h.provider() == providerMcount:
			if !inert { // an inert-looking cmp is no reference to mcount: nothing flips mcount calls
				fa.skip(addr, raw, in.String(), hookLabel(h), mcountReason)
			}
			return
		case h.provider() == probelist.ProviderFentry && !isCallEncoding(enc):
			fa.skip(addr, raw, in.String(), hookLabel(h), fentryJumpReason)
			return
		}
		s := site{addr: addr, enc: enc, cur: raw, inert: inert, hook: h, idx: i}
		if inert {
			fa.candidates = append(fa.candidates, candidate{s})
		} else if len(h.ambiguous) > 0 {
			fa.skip(addr, raw, in.String(), hookLabel(h), ambiguousReason(h))
		} else {
			fa.sites = append(fa.sites, s)
		}
	}
	rel32 := func(at int) uint64 {
		return addr + uint64(len(raw)) + uint64(int64(int32(binary.LittleEndian.Uint32(raw[at:]))))
	}
	if t, ok := relTarget(in, addr); ok {
		h := fa.o.target(t)
		if !h.found() {
			return
		}
		switch {
		case h.provider() == providerMcount:
			fa.skip(addr, raw, in.String(), hookLabel(h), mcountReason)
		case in.Op == x86asm.CALL && len(raw) == 5 && raw[0] == 0xe8:
			newSite(probelist.EncCallRel32, h, false)
		case in.Op == x86asm.CALL && len(raw) == 6 && raw[0] == 0x67 && raw[1] == 0xe8:
			newSite(probelist.EncAddr32Call, h, false)
		case in.Op == x86asm.JMP && len(raw) == 5 && raw[0] == 0xe9:
			newSite(probelist.EncJmpRel32, h, false)
		case in.Op == x86asm.CALL || in.Op == x86asm.JMP:
			fa.skip(addr, raw, in.String(), hookLabel(h), "branch to a hook in an encoding that has no inert form")
		default:
			fa.skip(addr, raw, in.String(), hookLabel(h), "conditional branch to a hook: turning it off would change the branch")
		}
		return
	}
	if slot, ok := ripTarget(in, addr); ok {
		switch {
		case in.Op == x86asm.CALL || in.Op == x86asm.JMP:
			h := fa.o.slot(slot)
			switch {
			case !h.found():
			case h.provider() == providerMcount:
				fa.skip(addr, raw, in.String(), hookLabel(h), mcountReason)
			case len(raw) == 6 && raw[0] == 0xff && raw[1] == 0x15:
				newSite(probelist.EncCallGOT, h, false)
			case len(raw) == 6 && raw[0] == 0xff && raw[1] == 0x25:
				newSite(probelist.EncJmpGOT, h, false)
			default:
				fa.skip(addr, raw, in.String(), hookLabel(h), "branch through a hook's GOT slot in an encoding that has no inert form")
			}
		case in.Op == x86asm.CMP && len(raw) == 6 && raw[0] == 0x3b && raw[1] == 0x15:
			if h := fa.o.slot(slot); h.found() {
				newSite(probelist.EncCallGOT, h, true)
			}
		case in.Op == x86asm.LEA:
			if h := fa.o.target(slot); h.found() {
				fa.skip(addr, raw, in.String(), hookLabel(h), "hook address taken into a register")
			}
		case in.Op == x86asm.MOV && in.MemBytes == 8:
			if h := fa.o.slot(slot); h.found() {
				fa.skip(addr, raw, in.String(), hookLabel(h), "hook address loaded from its GOT slot into a register")
			}
		}
		return
	}
	switch {
	case in.Op == x86asm.CMP && len(raw) == 5 && raw[0] == 0x3d:
		if h := fa.o.target(rel32(1)); h.found() {
			newSite(probelist.EncCallRel32, h, true)
		}
	case in.Op == x86asm.CMP && len(raw) == 6 && raw[0] == 0x67 && raw[1] == 0x3d:
		if h := fa.o.target(rel32(2)); h.found() {
			newSite(probelist.EncAddr32Call, h, true)
		}
	case in.Op == x86asm.MOV:
		if imm, ok := in.Args[1].(x86asm.Imm); ok && fa.o.f.Type == elf.ET_EXEC {
			if h := fa.o.definedHook(uint64(imm)); h.found() {
				fa.skip(addr, raw, in.String(), hookLabel(h), "hook address taken into a register")
			}
		}
	case in.Op == x86asm.CALL || in.Op == x86asm.JMP:
		if r, ok := in.Args[0].(x86asm.Reg); ok {
			fa.regCalls = append(fa.regCalls, regUse{i, r})
		}
	}
}

// linkBranches records the branches to each instruction. A branch into the
// middle of a decoded instruction means the linear decode is not the code
// the processor runs; then every site of the function is reported instead of
// trusted, and true is returned.
func (fa *funcAnalysis) linkBranches() bool {
	fa.jumpers = map[int][]int{}
	for i := range fa.insns {
		x := &fa.insns[i]
		if !isBranch(x.in) {
			continue
		}
		t, _ := relTarget(x.in, x.addr)
		if t < fa.fn.start || t >= fa.fn.end {
			continue
		}
		k := fa.index(t)
		if k < 0 {
			for _, s := range fa.sites {
				fa.skip(s.addr, s.cur, fa.insns[s.idx].in.String(), hookLabel(s.hook),
					fmt.Sprintf("the branch at %#x targets %#x, inside a decoded instruction: the linear decode of this function is unreliable", x.addr, t))
			}
			for _, c := range fa.candidates {
				fa.skip(c.addr, c.cur, fa.insns[c.idx].in.String(), hookLabel(c.hook), "inert-looking site in a function whose linear decode is unreliable")
			}
			fa.sites, fa.candidates = nil, nil
			return true
		}
		fa.jumpers[k] = append(fa.jumpers[k], i)
	}
	return false
}

// index returns the index of the instruction starting at addr, or -1.
func (fa *funcAnalysis) index(addr uint64) int {
	k := sort.Search(len(fa.insns), func(i int) bool { return fa.insns[i].addr >= addr })
	if k < len(fa.insns) && fa.insns[k].addr == addr {
		return k
	}
	return -1
}

// registerBranch reports a call or jump through a register that holds a
// hook's address: a hook reference with no inert form.
func (fa *funcAnalysis) registerBranch(u regUse) {
	v, ok := fa.valueBefore(u.idx, family(u.reg))
	if !ok {
		return
	}
	var h hookRef
	if v.slot {
		h = fa.o.slot(v.addr)
	} else {
		h = fa.o.target(v.addr)
	}
	if h.found() {
		x := fa.insns[u.idx]
		fa.skip(x.addr, x.raw, x.in.String(), hookLabel(h), "call or jump through a register holding a hook's address")
	}
}

// name recovers the function a site reports: the hook's first argument.
func (fa *funcAnalysis) name(s *site) {
	if s.hook.hook == hookEnterBare {
		s.fnAddr, s.resolved = fa.fn.start, true
		return
	}
	if fa.incomplete {
		return // branches from the undecoded rest could reach the site
	}
	v, ok := fa.valueBefore(s.idx, famRDI)
	if !ok {
		return
	}
	addr := v.addr
	if v.slot {
		if addr, ok = fa.o.slotValue(v.addr); !ok {
			return
		}
	}
	if fa.o.funcStarts[addr] {
		s.fnAddr, s.resolved = addr, true
	}
}
