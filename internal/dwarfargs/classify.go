package dwarfargs

import (
	"fmt"
	"strings"
)

// class is an eightbyte's class in the System V x86-64 ABI (section 3.2.3).
type class uint8

const (
	cNone class = iota
	cInteger
	cSSE
	cSSEUp
	cX87
	cX87Up
	cComplexX87
	cMemory
)

// LocKind says where a part of a value is.
type LocKind uint8

// Location kinds.
const (
	// LocInt: an integer register. Arguments: Reg 0..5 is rdi, rsi, rdx,
	// rcx, r8, r9; return values: Reg 0 is rax, 1 is rdx.
	LocInt LocKind = iota + 1
	// LocSSE: the low 8 bytes of an SSE register: xmm<Reg>.
	LocSSE
	// LocStack: the caller's stack arguments, Off bytes above the return
	// address (the function's entry rsp + 8 + Off).
	LocStack
)

// ArgRegs names the integer argument registers in order.
var ArgRegs = [6]string{"rdi", "rsi", "rdx", "rcx", "r8", "r9"}

// Part locates Size bytes of a value, which go At bytes into it.
type Part struct {
	Kind LocKind
	Reg  int
	Off  int64
	At   int64
	Size int64
}

func (p Part) String() string {
	switch p.Kind {
	case LocInt:
		return ArgRegs[p.Reg]
	case LocSSE:
		return fmt.Sprintf("xmm%d", p.Reg)
	case LocStack:
		return fmt.Sprintf("stack+%d", p.Off)
	}
	return "?"
}

// align is the natural alignment of t, as the ABI lays it out.
func align(t *Type) int64 {
	switch t.Kind {
	case KStruct, KUnion:
		a := int64(1)
		for _, f := range t.Fields {
			if fa := align(f.Type); fa > a {
				a = fa
			}
		}
		return a
	case KArray:
		return align(t.Elem)
	case KComplex:
		return align(t.Elem)
	}
	if t.Size > 0 && t.Size <= 16 && t.Size&(t.Size-1) == 0 {
		return t.Size
	}
	return 8
}

// classify returns the classes of t's eightbytes when it is passed by value,
// after the ABI's post-merger cleanup: all cMemory when it goes in memory.
// A non-empty reason says t cannot be classified at all.
func classify(t *Type) ([]class, string) {
	switch {
	case t.Kind == KVoid:
		return nil, "void"
	case t.Kind == KUnknown || t.Kind == KFunc:
		return nil, fmt.Sprintf("type %q is not understood", t.Name)
	case t.Size <= 0:
		return nil, fmt.Sprintf("type %q has no size in DWARF", t.Name)
	}
	n := (t.Size + 7) / 8
	mem := func() []class {
		c := make([]class, n)
		for i := range c {
			c[i] = cMemory
		}
		return c
	}
	if t.Size > 64 || (t.Size > 16 && !isVector(t)) {
		return mem(), ""
	}
	cls := make([]class, n)
	if !t.scalar() && !unalignedFree(t) {
		return mem(), ""
	}
	if why := leaves(t, 0, cls); why != "" {
		return nil, why
	}
	// Post-merger cleanup.
	for i, c := range cls {
		switch {
		case c == cMemory:
			return mem(), ""
		case c == cX87Up && (i == 0 || cls[i-1] != cX87):
			return mem(), ""
		case c == cSSEUp && (i == 0 || (cls[i-1] != cSSE && cls[i-1] != cSSEUp)):
			cls[i] = cSSE
		}
	}
	if t.Size > 16 && (cls[0] != cSSE || !allSSEUp(cls[1:])) {
		return mem(), ""
	}
	// X87 classes go in memory when passed as arguments; callers turn a
	// return value's X87 into st0 (see returnLoc).
	return cls, ""
}

func allSSEUp(cs []class) bool {
	for _, c := range cs {
		if c != cSSEUp {
			return false
		}
	}
	return true
}

func isVector(t *Type) bool { return t.Kind == KVector }

func (t *Type) scalar() bool {
	switch t.Kind {
	case KStruct, KUnion, KArray:
		return false
	}
	return true
}

// unalignedFree reports whether every member of aggregate t sits at its
// natural alignment (packed structs do not, and go in memory).
func unalignedFree(t *Type) bool {
	switch t.Kind {
	case KStruct, KUnion:
		for _, f := range t.Fields {
			if f.BitSize == 0 && f.Off%align(f.Type) != 0 {
				return false
			}
			if !unalignedFree(f.Type) {
				return false
			}
		}
	case KArray:
		return unalignedFree(t.Elem)
	}
	return true
}

// leaves merges the classes of the scalars of t, placed at byte off, into cls.
func leaves(t *Type, off int64, cls []class) string {
	put := func(at int64, c class) {
		i := at / 8
		if i < 0 || i >= int64(len(cls)) {
			return
		}
		cls[i] = merge(cls[i], c)
	}
	switch t.Kind {
	case KStruct, KUnion:
		if t.ByRef {
			return fmt.Sprintf("%s is passed by reference", t.Name)
		}
		for _, f := range t.Fields {
			if f.BitSize > 0 {
				put(off+f.Off+f.BitOff/8, cInteger)
				continue
			}
			if why := leaves(f.Type, off+f.Off, cls); why != "" {
				return why
			}
		}
	case KArray:
		if t.Count < 0 || t.Elem.Size <= 0 || t.Count*t.Elem.Size > 64 {
			return fmt.Sprintf("%s has no size that fits registers", t.Name)
		}
		for i := int64(0); i < t.Count; i++ {
			if why := leaves(t.Elem, off+i*t.Elem.Size, cls); why != "" {
				return why
			}
		}
	case KInt, KUint, KBool, KChar, KEnum, KPointer:
		for b := int64(0); b < t.Size; b += 8 {
			put(off+b, cInteger)
		}
	case KFloat:
		switch {
		case t.Size <= 8:
			put(off, cSSE)
		case isLongDouble(t):
			put(off, cX87)
			put(off+8, cX87Up)
		default: // __float128, _Float128
			put(off, cSSE)
			put(off+8, cSSEUp)
		}
	case KComplex:
		switch {
		case isLongDouble(t.Elem) || t.Size > 16:
			put(off, cComplexX87)
		default:
			for b := int64(0); b < t.Size; b += 8 {
				put(off+b, cSSE)
			}
		}
	case KVector:
		put(off, cSSE)
		for b := int64(8); b < t.Size; b += 8 {
			put(off+b, cSSEUp)
		}
	default:
		return fmt.Sprintf("type %q is not understood", t.Name)
	}
	return ""
}

func isLongDouble(t *Type) bool {
	return t.Kind == KFloat && t.Size == 16 && !strings.Contains(t.Name, "128")
}

func merge(a, b class) class {
	switch {
	case a == b:
		return a
	case a == cNone:
		return b
	case b == cNone:
		return a
	case a == cMemory || b == cMemory:
		return cMemory
	case a == cInteger || b == cInteger:
		return cInteger
	case a == cX87 || a == cX87Up || a == cComplexX87 || b == cX87 || b == cX87Up || b == cComplexX87:
		return cMemory
	}
	return cSSE
}

// assigner hands out argument locations in declaration order.
type assigner struct {
	nextInt, nextSSE int
	stack            int64
}

// place returns where an argument of type t goes, consuming registers or
// stack, or a reason it cannot be said.
func (a *assigner) place(t *Type) ([]Part, string) {
	if t.ByRef {
		// C++: the caller passes the address of a temporary copy.
		if a.nextInt < 6 {
			a.nextInt++
			return []Part{{Kind: LocInt, Reg: a.nextInt - 1, Size: 8}}, ""
		}
		a.stack += 8
		return []Part{{Kind: LocStack, Off: a.stack - 8, Size: 8}}, ""
	}
	cls, why := classify(t)
	if why != "" {
		return nil, why
	}
	needInt, needSSE := 0, 0
	inMem := false
	for _, c := range cls {
		switch c {
		case cInteger:
			needInt++
		case cSSE:
			needSSE++
		case cSSEUp:
		default: // memory, X87 (long double arguments go on the stack)
			inMem = true
		}
	}
	if !inMem && a.nextInt+needInt <= 6 && a.nextSSE+needSSE <= 8 {
		var parts []Part
		for i, c := range cls {
			size := min(8, t.Size-int64(i)*8)
			switch c {
			case cInteger:
				parts = append(parts, Part{Kind: LocInt, Reg: a.nextInt, At: int64(i) * 8, Size: size})
				a.nextInt++
			case cSSE:
				parts = append(parts, Part{Kind: LocSSE, Reg: a.nextSSE, At: int64(i) * 8, Size: size})
				a.nextSSE++
			case cSSEUp:
				// The upper half of a vector register: not in the low 8 bytes.
				parts = append(parts, Part{Kind: LocSSE, Reg: a.nextSSE - 1, At: int64(i) * 8, Size: -1})
			}
		}
		return parts, ""
	}
	// In memory, or not enough registers left for all of it: the whole
	// argument goes on the stack, and later arguments may still use
	// registers.
	al := max(8, align(t))
	a.stack = (a.stack + al - 1) / al * al
	p := Part{Kind: LocStack, Off: a.stack, Size: t.Size}
	a.stack += (t.Size + 7) / 8 * 8
	return []Part{p}, ""
}

// returnLoc says where a value of type t is returned. inMemory: the caller
// passed a hidden pointer in rdi and rax holds it on return.
func returnLoc(t *Type) (parts []Part, inMemory bool, why string) {
	if t.Kind == KVoid {
		return nil, false, ""
	}
	if t.ByRef {
		return nil, true, ""
	}
	if t.Kind == KComplex && isLongDouble(t.Elem) {
		// COMPLEX_X87: returned in st0 and st1, not in memory, though it is
		// larger than 16 bytes.
		return nil, false, "returned in the x87 registers st0 and st1, which the return probe does not save"
	}
	cls, why := classify(t)
	if why != "" {
		return nil, false, why
	}
	nInt, nSSE := 0, 0
	for i, c := range cls {
		size := min(8, t.Size-int64(i)*8)
		switch c {
		case cMemory:
			return nil, true, ""
		case cInteger:
			parts = append(parts, Part{Kind: LocInt, Reg: nInt, At: int64(i) * 8, Size: size})
			nInt++
		case cSSE:
			parts = append(parts, Part{Kind: LocSSE, Reg: nSSE, At: int64(i) * 8, Size: size})
			nSSE++
		case cSSEUp:
			parts = append(parts, Part{Kind: LocSSE, Reg: nSSE - 1, At: int64(i) * 8, Size: -1})
		case cX87, cX87Up, cComplexX87:
			return nil, false, "returned in the x87 register st0, which the return probe does not save"
		}
	}
	return parts, false, ""
}
