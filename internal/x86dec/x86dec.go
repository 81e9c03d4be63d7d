// Package x86dec decodes x86-64 instructions with golang.org/x/arch/x86/x86asm
// and corrects the faults of that decoder that matter to a linear sweep over
// compiled code. A wrong instruction length desynchronises the sweep, after
// which every later "instruction" in the function is fiction; the scanner
// rewrites bytes at the addresses the sweep produces, so a length the wrapper
// cannot vouch for is an error, never a guess.
//
// Faults guarded (x86asm v0.32.0):
//
//   - endbr64 (f3 0f 1e fa) and endbr32 (f3 0f 1e fb), the CET landing pads
//     that -fcf-protection puts at every function entry and PLT entry, decode
//     as a lone REP prefix of length 1.
//   - vzeroupper and vzeroall (VEX 0f 77, in both the 2-byte c5 and 3-byte c4
//     VEX forms) are decoded as if they had a ModRM byte: the length depends
//     on the bytes that follow (4 or more instead of 3 or 4), or the decode
//     fails with "truncated" near the end of the buffer.
//   - Any other decode that yields no opcode (a prefix alone, such as the REP
//     of rdsspq f3 48 0f 1e c8) is turned into an error, since the decoder's
//     length for it is meaningless.
package x86dec

import (
	"errors"
	"fmt"

	"golang.org/x/arch/x86/x86asm"
)

// Kind distinguishes the instructions the wrapper decodes itself from those
// x86asm decodes.
type Kind uint8

const (
	KindX86asm  Kind = iota // Inst is x86asm's decode (with Len corrected where guarded)
	KindEndbr64             // endbr64; Inst.Op is 0
	KindEndbr32             // endbr32; Inst.Op is 0
)

// Inst is one decoded instruction.
type Inst struct {
	x86asm.Inst
	Kind Kind
}

// ErrUndecodable is wrapped by every error Decode returns for bytes it cannot
// vouch for.
var ErrUndecodable = errors.New("undecodable instruction")

// String returns Intel syntax, naming the instructions x86asm cannot.
func (i Inst) String() string {
	switch i.Kind {
	case KindEndbr64:
		return "endbr64"
	case KindEndbr32:
		return "endbr32"
	}
	return x86asm.IntelSyntax(i.Inst, 0, nil)
}

// Decode decodes the instruction at the start of code in 64-bit mode.
func Decode(code []byte) (Inst, error) {
	if len(code) >= 4 && code[0] == 0xf3 && code[1] == 0x0f && code[2] == 0x1e {
		switch code[3] {
		case 0xfa:
			return Inst{Inst: x86asm.Inst{Mode: 64, Len: 4}, Kind: KindEndbr64}, nil
		case 0xfb:
			return Inst{Inst: x86asm.Inst{Mode: 64, Len: 4}, Kind: KindEndbr32}, nil
		}
	}
	if in, ok, err := decodeVZero(code); ok || err != nil {
		return in, err
	}
	in, err := x86asm.Decode(code, 64)
	if err != nil {
		return Inst{}, fmt.Errorf("%w: % x: %v", ErrUndecodable, head(code), err)
	}
	if in.Op == 0 || in.Len <= 0 || in.Len > len(code) {
		return Inst{}, fmt.Errorf("%w: % x: decoder returned no opcode", ErrUndecodable, head(code))
	}
	if in.Op == x86asm.VZEROUPPER || in.Op == x86asm.VZEROALL {
		// decodeVZero recognises every valid encoding; anything else
		// that x86asm calls vzero* is one whose length it gets wrong.
		return Inst{}, fmt.Errorf("%w: % x: unexpected %v encoding", ErrUndecodable, head(code), in.Op)
	}
	return Inst{Inst: in}, nil
}

// decodeVZero decodes VEX.0F 77 (vzeroupper with VEX.L=0, vzeroall with
// VEX.L=1), which has no ModRM byte. ok is false when code is not a VEX 0f 77
// instruction at all.
func decodeVZero(code []byte) (in Inst, ok bool, err error) {
	// Segment and address-size prefixes may precede a VEX prefix; 66, f2,
	// f3, f0 and REX make it #UD.
	i := 0
	for i < len(code) && i < 14 && isSegOrAddrPrefix(code[i]) {
		i++
	}
	if i >= len(code) || (code[i] != 0xc5 && code[i] != 0xc4) {
		return Inst{}, false, nil
	}
	var vvvvLpp byte
	var n int
	switch code[i] {
	case 0xc5:
		if i+2 >= len(code) || code[i+2] != 0x77 {
			return Inst{}, false, nil
		}
		vvvvLpp, n = code[i+1]&0x7f, i+3
	case 0xc4:
		if i+3 >= len(code) || code[i+1]&0x1f != 1 || code[i+3] != 0x77 {
			return Inst{}, false, nil
		}
		vvvvLpp, n = code[i+2]&0x7f, i+4
	}
	if vvvvLpp&0x7b != 0x78 { // vvvv must be 1111b and pp 00b, or the instruction is #UD
		return Inst{}, false, fmt.Errorf("%w: % x: invalid VEX 0f 77 encoding", ErrUndecodable, head(code))
	}
	op := x86asm.VZEROUPPER
	if vvvvLpp&0x04 != 0 {
		op = x86asm.VZEROALL
	}
	return Inst{Inst: x86asm.Inst{Op: op, Mode: 64, Len: n}}, true, nil
}

func isSegOrAddrPrefix(b byte) bool {
	switch b {
	case 0x26, 0x2e, 0x36, 0x3e, 0x64, 0x65, 0x67:
		return true
	}
	return false
}

// head returns at most the first 15 bytes, the longest x86 instruction, for
// error messages.
func head(code []byte) []byte {
	if len(code) > 15 {
		return code[:15]
	}
	return code
}
