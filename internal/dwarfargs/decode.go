package dwarfargs

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/big"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
)

// Bounds on what a capture copies per call.
const (
	// StringMax: bytes copied from a char * argument or return value.
	StringMax = 64
	// StackMax: bytes of the caller's stack arguments copied at entry.
	StackMax = 64
	// maxElems: array elements and struct members decoded per value.
	maxElems = 32
)

// CString is what a capture copied from a char * value.
type CString struct {
	Bytes    []byte // up to the NUL (excluded) or StringMax bytes
	Complete bool   // a NUL ended it within the bound
	Fault    bool   // the memory could not be read
}

// EntryRegs is what a capture copied at a function's first instruction.
type EntryRegs struct {
	Int   [6]uint64 // rdi, rsi, rdx, rcx, r8, r9
	SSE   [8]uint64 // low 8 bytes of xmm0..xmm7
	Stack []byte    // stack arguments from the entry rsp+8 on, as many bytes as were copied
	Str   [6]*CString
}

// ExitRegs is what a capture copied at the function's return.
type ExitRegs struct {
	Int [2]uint64 // rax, rdx
	SSE [2]uint64 // low 8 bytes of xmm0, xmm1
	Str *CString  // copied from rax when the plan asked for it
}

// Plan is what a runtime must copy for one function; bit i of a mask
// stands for register i (integer arguments in ArgRegs order; rax, rdx and
// xmm0, xmm1 for the return).
type Plan struct {
	IntRegs    uint8
	SSERegs    uint8
	StackBytes int
	StringRegs uint8
	RetInt     uint8
	RetSSE     uint8
	RetString  bool
}

// Plan returns what a capture of s's arguments and return value copies.
func (s *Signature) Plan() Plan {
	var p Plan
	for _, a := range s.Params {
		for _, part := range a.Parts {
			switch {
			case part.Kind == LocInt:
				p.IntRegs |= 1 << part.Reg
				if a.Type.CString && !a.ByRef {
					p.StringRegs |= 1 << part.Reg
				}
			case part.Kind == LocSSE && part.Size > 0:
				p.SSERegs |= 1 << part.Reg
			case part.Kind == LocStack:
				p.StackBytes = max(p.StackBytes, int(min(part.Off+part.Size, StackMax)))
			}
		}
	}
	if s.Ret.InMemory {
		p.RetInt |= 1
	}
	for _, part := range s.Ret.Parts {
		switch {
		case part.Kind == LocInt:
			p.RetInt |= 1 << part.Reg
		case part.Kind == LocSSE && part.Size > 0:
			p.RetSSE |= 1 << part.Reg
		}
	}
	p.RetString = s.Ret.Type != nil && s.Ret.Type.CString && len(s.Ret.Parts) == 1
	return p
}

// DecodeArgs turns what a capture copied at entry into the arguments'
// values, in declaration order.
func (s *Signature) DecodeArgs(r *EntryRegs) []calltrace.Value {
	out := make([]calltrace.Value, 0, len(s.Params))
	for _, p := range s.Params {
		v := decodeParts(p.Type, p.Parts, p.Missing, func(part Part) ([]byte, string) {
			switch part.Kind {
			case LocInt:
				return le(r.Int[part.Reg]), ""
			case LocSSE:
				return le(r.SSE[part.Reg]), ""
			}
			if part.Off+part.Size > int64(len(r.Stack)) {
				return nil, fmt.Sprintf("passed on the stack at +%d, beyond the %d bytes of stack arguments copied", part.Off, len(r.Stack))
			}
			return r.Stack[part.Off : part.Off+part.Size], ""
		})
		if p.ByRef && v.Kind == calltrace.Pointer {
			v.Type += " (passed by reference)"
		}
		if p.Type.CString && v.Kind == calltrace.Pointer && len(p.Parts) == 1 && p.Parts[0].Kind == LocInt {
			v = stringValue(v, r.Str[p.Parts[0].Reg])
		}
		v.Name = p.Name
		out = append(out, v)
	}
	if s.Variadic {
		out = append(out, calltrace.Value{Name: "...", Kind: calltrace.Missing, Note: "variadic arguments are not described"})
	}
	return out
}

// DecodeRet turns what a capture copied at the return into the return
// value; nil for a void function.
func (s *Signature) DecodeRet(r *ExitRegs) *calltrace.Value {
	t := s.Ret.Type
	if t == nil || t.Kind == KVoid {
		return nil
	}
	if s.Ret.InMemory {
		v := calltrace.Value{Type: t.Name, Kind: calltrace.Missing, Note: "returned in the caller's memory at " + calltrace.Hex(r.Int[0])}
		return &v
	}
	v := decodeParts(t, s.Ret.Parts, s.Ret.Missing, func(part Part) ([]byte, string) {
		if part.Kind == LocInt {
			return le(r.Int[part.Reg]), ""
		}
		return le(r.SSE[part.Reg]), ""
	})
	if t.CString && v.Kind == calltrace.Pointer {
		v = stringValue(v, r.Str)
	}
	return &v
}

func le(u uint64) []byte { return binary.LittleEndian.AppendUint64(nil, u) }

// decodeParts assembles a value's bytes from its parts and decodes them.
func decodeParts(t *Type, parts []Part, missing string, read func(Part) ([]byte, string)) calltrace.Value {
	if missing != "" {
		return calltrace.Value{Type: t.Name, Kind: calltrace.Missing, Note: missing}
	}
	size := t.Size
	if t.ByRef {
		size = 8
	}
	buf := make([]byte, size)
	for _, p := range parts {
		if p.Size < 0 {
			return calltrace.Value{Type: t.Name, Kind: calltrace.Missing, Note: "the upper half of a vector register is not copied"}
		}
		b, why := read(p)
		if why != "" {
			return calltrace.Value{Type: t.Name, Kind: calltrace.Missing, Note: why}
		}
		copy(buf[p.At:min(p.At+p.Size, size)], b)
	}
	if t.ByRef {
		return calltrace.Value{Type: t.Name, Kind: calltrace.Pointer, Uint: binary.LittleEndian.Uint64(buf)}
	}
	return decode(t, buf, 0)
}

func stringValue(v calltrace.Value, s *CString) calltrace.Value {
	v.Kind = calltrace.String
	switch {
	case v.Uint == 0:
	case s == nil:
		v.Kind = calltrace.Pointer
	case s.Fault:
		v.Note = "unreadable"
	default:
		v.Str, v.Truncated = string(s.Bytes), !s.Complete
	}
	return v
}

// decode interprets b (t.Size bytes) as a value of type t.
func decode(t *Type, b []byte, depth int) calltrace.Value {
	v := calltrace.Value{Type: t.Name}
	if int64(len(b)) < t.Size || depth > 8 {
		v.Kind, v.Note = calltrace.Missing, "not decoded"
		return v
	}
	switch t.Kind {
	case KInt, KEnum, KChar, KUint, KBool, KPointer:
		signed := t.Kind == KInt || ((t.Kind == KEnum || t.Kind == KChar) && t.Signed)
		if t.Size == 16 {
			return wide(v, b, signed)
		}
		u, i := integer(b[:t.Size], signed)
		switch t.Kind {
		case KInt:
			v.Kind, v.Int = calltrace.Int, i
		case KUint:
			v.Kind, v.Uint = calltrace.Uint, u
		case KBool:
			v.Kind, v.Uint = calltrace.Bool, u&1
		case KChar:
			v.Kind, v.Int = calltrace.Char, i
		case KPointer:
			v.Kind, v.Uint = calltrace.Pointer, u
		case KEnum:
			v.Kind, v.Int = calltrace.Enum, i
			for _, e := range t.Enums {
				if e.Val == i {
					v.Str = e.Name
					break
				}
			}
		}
	case KFloat:
		switch {
		case t.Size == 4:
			v.Kind, v.Float, v.Float32 = calltrace.Float, float64(math.Float32frombits(binary.LittleEndian.Uint32(b))), true
		case t.Size == 8:
			v.Kind, v.Float = calltrace.Float, math.Float64frombits(binary.LittleEndian.Uint64(b))
		case isLongDouble(t):
			v.Kind, v.Float = calltrace.Float, x87(b)
		default:
			v.Kind, v.Note = calltrace.Missing, t.Name+" values are not decoded"
		}
	case KComplex:
		half := t.Size / 2
		v.Kind = calltrace.Struct
		v.Fields = []calltrace.Value{decode(t.Elem, b[:half], depth+1), decode(t.Elem, b[half:], depth+1)}
		v.Fields[0].Name, v.Fields[1].Name = "re", "im"
	case KStruct, KUnion:
		v.Kind = calltrace.Struct
		for i, f := range t.Fields {
			if i == maxElems {
				v.Fields = append(v.Fields, calltrace.Value{Name: "...", Kind: calltrace.Missing, Note: fmt.Sprintf("%d more members", len(t.Fields)-i)})
				break
			}
			var fv calltrace.Value
			switch {
			case f.BitSize > 0:
				fv = bitfield(f, b)
			case f.Off < 0 || f.Type.Size < 0 || f.Off+f.Type.Size > int64(len(b)):
				fv = calltrace.Value{Type: f.Type.Name, Kind: calltrace.Missing, Note: "outside the value"}
			default:
				fv = decode(f.Type, b[f.Off:f.Off+f.Type.Size], depth+1)
			}
			fv.Name = f.Name
			v.Fields = append(v.Fields, fv)
		}
	case KArray:
		v.Kind = calltrace.Struct
		for i := int64(0); i < t.Count; i++ {
			if i == maxElems {
				v.Fields = append(v.Fields, calltrace.Value{Name: "...", Kind: calltrace.Missing, Note: fmt.Sprintf("%d more elements", t.Count-i)})
				break
			}
			ev := decode(t.Elem, b[i*t.Elem.Size:(i+1)*t.Elem.Size], depth+1)
			ev.Name = fmt.Sprintf("[%d]", i)
			v.Fields = append(v.Fields, ev)
		}
	default:
		v.Kind, v.Note = calltrace.Missing, t.Name+" values are not decoded"
	}
	return v
}

func integer(b []byte, signed bool) (uint64, int64) {
	var u uint64
	for i := len(b) - 1; i >= 0; i-- {
		u = u<<8 | uint64(b[i])
	}
	shift := 64 - 8*uint(len(b))
	if signed {
		return u, int64(u<<shift) >> shift
	}
	return u, int64(u)
}

// wide decodes a 128-bit integer: Int or Uint when it fits, else Wide.
func wide(v calltrace.Value, b []byte, signed bool) calltrace.Value {
	lo, hi := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:])
	switch {
	case signed && ((hi == 0 && lo < 1<<63) || (hi == math.MaxUint64 && lo >= 1<<63)):
		v.Kind, v.Int = calltrace.Int, int64(lo)
	case !signed && hi == 0:
		v.Kind, v.Uint = calltrace.Uint, lo
	default:
		n := new(big.Int).Lsh(new(big.Int).SetUint64(hi), 64)
		n.Or(n, new(big.Int).SetUint64(lo))
		if signed && hi>>63 == 1 {
			n.Sub(n, new(big.Int).Lsh(big.NewInt(1), 128))
		}
		v.Kind, v.Str = calltrace.Wide, n.String()
	}
	return v
}

func bitfield(f Field, b []byte) calltrace.Value {
	pos := f.Off*8 + f.BitOff
	var u uint64
	for i := int64(0); i < f.BitSize; i++ {
		bit := pos + i
		if bit/8 >= int64(len(b)) {
			return calltrace.Value{Type: f.Type.Name, Kind: calltrace.Missing, Note: "outside the value"}
		}
		u |= uint64(b[bit/8]>>(bit%8)&1) << i
	}
	v := calltrace.Value{Type: f.Type.Name}
	signed := f.Type.Kind == KInt || (f.Type.Kind == KEnum && f.Type.Signed)
	if signed && f.BitSize < 64 && u>>(f.BitSize-1)&1 == 1 {
		u |= ^uint64(0) << f.BitSize
	}
	switch f.Type.Kind {
	case KBool:
		v.Kind, v.Uint = calltrace.Bool, u&1
	case KInt:
		v.Kind, v.Int = calltrace.Int, int64(u)
	case KEnum:
		v.Kind, v.Int = calltrace.Enum, int64(u)
		for _, e := range f.Type.Enums {
			if e.Val == int64(u) {
				v.Str = e.Name
			}
		}
	default:
		v.Kind, v.Uint = calltrace.Uint, u
	}
	return v
}

// x87 converts an 80-bit extended-precision value to the nearest float64.
func x87(b []byte) float64 {
	mant := binary.LittleEndian.Uint64(b)
	se := binary.LittleEndian.Uint16(b[8:])
	sign, exp := se>>15, int(se&0x7fff)
	var f float64
	switch {
	case exp == 0x7fff && mant<<1 == 0:
		f = math.Inf(1)
	case exp == 0x7fff:
		return math.NaN()
	default:
		if exp == 0 {
			exp = 1 // denormal: no implicit bit, same scale as the smallest normal
		}
		f = math.Ldexp(float64(mant), exp-16383-63)
	}
	if sign == 1 {
		f = -f
	}
	return f
}
