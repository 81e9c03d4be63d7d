package probelist

import "fmt"

// The first opcode byte of each active form and of its flip-inert form. Each
// flip keeps the instruction length and operand bytes, so the two forms differ
// in byte 0 only (byte 1 for addr32_call, whose byte 0 is the 0x67 prefix):
//
//	e8 rel32     call rel32      <-> 3d rel32     cmp eax, imm32
//	e9 rel32     jmp rel32       <-> c3 rel32     ret (4 dead bytes)
//	ff 15 disp32 call [rip+d]    <-> 3b 15 disp32 cmp edx, [rip+d]
//	ff 25 disp32 jmp [rip+d]     <-> c3 25 disp32 ret (5 dead bytes)
//	67 e8 rel32  addr32 call     <-> 67 3d rel32  cmp eax, imm32
//
// docs/placeholders.md argues why each inert form is equivalent to the hook
// call being absent.
var flipTable = map[string]struct {
	at            int  // index of the byte that differs
	active, inert byte // its value in each form
}{
	EncCallRel32:  {0, 0xe8, 0x3d},
	EncJmpRel32:   {0, 0xe9, 0xc3},
	EncCallGOT:    {0, 0xff, 0x3b},
	EncJmpGOT:     {0, 0xff, 0xc3},
	EncAddr32Call: {1, 0xe8, 0x3d},
}

// Multi-byte NOPs recommended by the Intel SDM (Vol. 2B, NOP).
var (
	nop5 = []byte{0x0f, 0x1f, 0x44, 0x00, 0x00}
	nop6 = []byte{0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00}
)

// InertForm returns the inert bytes for a site whose active bytes are given,
// in the named placeholder style. Jumps become a return in both styles (a NOP
// in place of a tail jump would fall through into the next function); their
// operand bytes stay as they were, dead, which keeps the site recognisable.
func InertForm(enc string, active []byte, placeholder string) (Bytes, error) {
	f, ok := flipTable[enc]
	if !ok {
		return nil, fmt.Errorf("unknown encoding %q", enc)
	}
	if len(active) != encodingLength[enc] || active[f.at] != f.active {
		return nil, fmt.Errorf("bytes % x are not an active %s site", active, enc)
	}
	if placeholder != PlaceholderFlip && placeholder != PlaceholderNop {
		return nil, fmt.Errorf("unknown placeholder %q", placeholder)
	}
	out := append(Bytes(nil), active...)
	switch {
	case placeholder == PlaceholderFlip || enc == EncJmpRel32 || enc == EncJmpGOT:
		out[f.at] = f.inert
	case len(out) == 5:
		copy(out, nop5)
	default:
		copy(out, nop6)
	}
	return out, nil
}

// ActiveFromFlip returns the active bytes of a site found in its flip-inert
// form, or ok=false when the bytes are not that encoding's flip form.
func ActiveFromFlip(enc string, inert []byte) (Bytes, bool) {
	f, ok := flipTable[enc]
	if !ok || len(inert) != encodingLength[enc] || inert[f.at] != f.inert {
		return nil, false
	}
	out := append(Bytes(nil), inert...)
	out[f.at] = f.active
	return out, true
}
