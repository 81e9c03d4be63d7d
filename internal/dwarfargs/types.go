package dwarfargs

import (
	"debug/dwarf"
	"fmt"
	"strings"
)

// TypeKind classifies a C type for the calling convention and for decoding.
type TypeKind uint8

// Type kinds.
const (
	KVoid TypeKind = iota
	KInt
	KUint
	KBool
	KChar  // char, signed char, unsigned char (Signed says which)
	KFloat // float, double, long double, _Float128 (Size says which)
	KComplex
	KPointer // also C++ references
	KEnum
	KStruct // struct or class
	KUnion
	KArray
	KVector // GCC vector extension (__m128, __m256d, ...)
	KFunc
	KUnknown // something this package does not model
)

// Type is a C type as far as passing and printing it needs.
type Type struct {
	Kind   TypeKind
	Name   string // C spelling as declared: "const char *", "struct pt", "size_t"
	Size   int64  // bytes; -1 unknown (incomplete)
	Signed bool   // KChar, KEnum: signed representation
	Elem   *Type  // KPointer target (nil: void), KArray/KVector/KComplex element
	Count  int64  // KArray/KVector elements (-1 unknown)
	Fields []Field
	Enums  []Enumerator
	// ByRef: C++ says objects of this type are passed by invisible
	// reference (DW_CC_pass_by_reference: a non-trivial copy or destructor).
	ByRef bool
	// CString: a pointer to plain char, read as a bounded C string.
	CString bool
}

// Field is a struct or union member.
type Field struct {
	Name    string
	Type    *Type
	Off     int64 // bytes from the start of the aggregate
	BitOff  int64 // bit-field: bits from Off*8 (little-endian), else 0
	BitSize int64 // bit-field width; 0 for ordinary members
}

// Enumerator is one named value of an enum.
type Enumerator struct {
	Name string
	Val  int64
}

func (t *Type) String() string { return t.Name }

// DWARF attributes and constants debug/dwarf does not name.
const (
	attrGNUVector      dwarf.Attr = 0x2107
	attrCallingConv    dwarf.Attr = 0x36 // DW_AT_calling_convention
	ccPassByReference             = 4
	encBoolean                    = 0x2
	encComplexFloat               = 0x3
	encFloat                      = 0x4
	encSigned                     = 0x5
	encSignedChar                 = 0x6
	encUnsigned                   = 0x7
	encUnsignedChar               = 0x8
	encUTF                        = 0x10
	tagRvalueReference dwarf.Tag  = 0x42
	tagAtomic          dwarf.Tag  = 0x47
)

// typeReader converts DWARF type DIEs, each once.
type typeReader struct {
	d     *dwarf.Data
	cache map[dwarf.Offset]*Type
	depth int
}

var voidType = &Type{Kind: KVoid, Name: "void", Size: 0}

func (tr *typeReader) entry(off dwarf.Offset) (*dwarf.Entry, *dwarf.Reader, error) {
	r := tr.d.Reader()
	r.Seek(off)
	e, err := r.Next()
	if err != nil {
		return nil, nil, err
	}
	if e == nil || e.Offset != off {
		return nil, nil, fmt.Errorf("no DWARF entry at %#x", off)
	}
	return e, r, nil
}

// typeOf converts the type an entry's DW_AT_type refers to (void if none).
func (tr *typeReader) typeOf(e *dwarf.Entry) (*Type, error) {
	off, ok := e.Val(dwarf.AttrType).(dwarf.Offset)
	if !ok {
		return voidType, nil
	}
	return tr.read(off)
}

func (tr *typeReader) read(off dwarf.Offset) (*Type, error) {
	if t, ok := tr.cache[off]; ok {
		return t, nil
	}
	if tr.depth > 64 {
		return nil, fmt.Errorf("DWARF type at %#x: nesting too deep", off)
	}
	tr.depth++
	defer func() { tr.depth-- }()
	e, r, err := tr.entry(off)
	if err != nil {
		return nil, err
	}
	t := &Type{Size: -1}
	tr.cache[off] = t // before children, for self-referencing structs
	size, hasSize := e.Val(dwarf.AttrByteSize).(int64)
	if hasSize {
		t.Size = size
	}
	name, _ := e.Val(dwarf.AttrName).(string)
	switch e.Tag {
	case dwarf.TagBaseType:
		enc, _ := e.Val(dwarf.AttrEncoding).(int64)
		t.Name = name
		switch enc {
		case encBoolean:
			t.Kind = KBool
		case encFloat:
			t.Kind = KFloat
		case encComplexFloat:
			t.Kind = KComplex
			t.Elem = &Type{Kind: KFloat, Size: t.Size / 2, Name: "double"}
			if t.Size == 8 {
				t.Elem.Name = "float"
			}
		case encSignedChar:
			t.Kind, t.Signed = KChar, true
		case encUnsignedChar:
			t.Kind = KChar
		case encSigned:
			t.Kind = KInt
		case encUnsigned, encUTF:
			t.Kind = KUint
		default:
			t.Kind = KUnknown
		}
	case dwarf.TagUnspecifiedType: // C++ decltype(nullptr)
		t.Kind, t.Name, t.Size = KPointer, name, 8
	case dwarf.TagPointerType, dwarf.TagReferenceType, tagRvalueReference:
		t.Kind, t.Size = KPointer, 8
		elem, err := tr.typeOf(e)
		if err != nil {
			return nil, err
		}
		if elem.Kind != KVoid {
			t.Elem = elem
		}
		sym := " *"
		switch e.Tag {
		case dwarf.TagReferenceType:
			sym = " &"
		case tagRvalueReference:
			sym = " &&"
		}
		if elem.Kind == KFunc {
			t.Name = strings.Replace(elem.Name, "(*)", "(*)", 1)
		} else {
			t.Name = elem.Name + sym
		}
		t.CString = e.Tag == dwarf.TagPointerType && elem.Kind == KChar && plainChar(elem.Name)
	case dwarf.TagConstType, dwarf.TagVolatileType, dwarf.TagRestrictType, tagAtomic:
		base, err := tr.typeOf(e)
		if err != nil {
			return nil, err
		}
		q := map[dwarf.Tag]string{dwarf.TagConstType: "const", dwarf.TagVolatileType: "volatile", dwarf.TagRestrictType: "restrict", tagAtomic: "_Atomic"}[e.Tag]
		*t = *base
		if base.Kind == KPointer {
			t.Name = base.Name + " " + q
		} else {
			t.Name = q + " " + base.Name
		}
	case dwarf.TagTypedef:
		base, err := tr.typeOf(e)
		if err != nil {
			return nil, err
		}
		*t = *base
		t.Name = name
	case dwarf.TagStructType, dwarf.TagClassType, dwarf.TagUnionType:
		t.Kind = KStruct
		word := "struct "
		if e.Tag == dwarf.TagUnionType {
			t.Kind, word = KUnion, "union "
		}
		if name == "" {
			name = "<anonymous>"
		}
		t.Name = word + name
		if e.Tag == dwarf.TagClassType {
			t.Name = name
		}
		if cc, _ := e.Val(attrCallingConv).(int64); cc == ccPassByReference {
			t.ByRef = true
		}
		if decl, _ := e.Val(dwarf.AttrDeclaration).(bool); decl {
			t.Size = -1
			break
		}
		if err := tr.members(t, e, r); err != nil {
			return nil, err
		}
	case dwarf.TagArrayType:
		elem, err := tr.typeOf(e)
		if err != nil {
			return nil, err
		}
		t.Kind, t.Elem, t.Count = KArray, elem, -1
		if v, _ := e.Val(attrGNUVector).(bool); v {
			t.Kind = KVector
		}
		err = eachChild(r, e, func(c *dwarf.Entry) error {
			if c.Tag == dwarf.TagSubrangeType && t.Count < 0 {
				if n, ok := c.Val(dwarf.AttrCount).(int64); ok {
					t.Count = n
				} else if ub, ok := c.Val(dwarf.AttrUpperBound).(int64); ok {
					t.Count = ub + 1
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if t.Count >= 0 && elem.Size >= 0 && !hasSize {
			t.Size = t.Count * elem.Size
		}
		t.Name = fmt.Sprintf("%s[%d]", elem.Name, t.Count)
		if t.Kind == KVector {
			t.Name = fmt.Sprintf("%s __attribute__((vector_size(%d)))", elem.Name, t.Size)
		}
	case dwarf.TagEnumerationType:
		t.Kind, t.Name = KEnum, "enum "+name
		if name == "" {
			t.Name = "enum <anonymous>"
		}
		if under, ok := e.Val(dwarf.AttrType).(dwarf.Offset); ok {
			u, err := tr.read(under)
			if err != nil {
				return nil, err
			}
			t.Signed = u.Kind == KInt || (u.Kind == KChar && u.Signed)
		}
		err := eachChild(r, e, func(c *dwarf.Entry) error {
			if c.Tag == dwarf.TagEnumerator {
				n, _ := c.Val(dwarf.AttrName).(string)
				v, _ := c.Val(dwarf.AttrConstValue).(int64)
				t.Enums = append(t.Enums, Enumerator{n, v})
				if v < 0 {
					t.Signed = true
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	case dwarf.TagSubroutineType:
		ret, err := tr.typeOf(e)
		if err != nil {
			return nil, err
		}
		t.Kind, t.Name = KFunc, ret.Name+" (*)()"
	default:
		t.Kind, t.Name = KUnknown, name
	}
	return t, nil
}

func plainChar(name string) bool {
	name = strings.TrimPrefix(strings.TrimPrefix(name, "const "), "volatile ")
	return name == "char"
}

// members reads the children of a struct, class or union.
func (tr *typeReader) members(t *Type, e *dwarf.Entry, r *dwarf.Reader) error {
	return eachChild(r, e, func(c *dwarf.Entry) error {
		if (c.Tag == dwarf.TagMember || c.Tag == dwarf.TagInheritance) && !staticMember(c) {
			f, err := tr.member(t, c)
			if err != nil {
				return err
			}
			t.Fields = append(t.Fields, f)
		}
		return nil
	})
}

// eachChild calls fn for each direct child of e, which r has just read.
func eachChild(r *dwarf.Reader, e *dwarf.Entry, fn func(c *dwarf.Entry) error) error {
	if !e.Children {
		return nil
	}
	for {
		c, err := r.Next()
		if err != nil {
			return err
		}
		if c == nil || c.Tag == 0 {
			return nil
		}
		if err := fn(c); err != nil {
			return err
		}
		if c.Children {
			r.SkipChildren()
		}
	}
}

// staticMember: a C++ static data member, which takes no room in objects.
func staticMember(c *dwarf.Entry) bool {
	ext, _ := c.Val(dwarf.AttrExternal).(bool)
	decl, _ := c.Val(dwarf.AttrDeclaration).(bool)
	return ext || decl
}

func (tr *typeReader) member(t *Type, c *dwarf.Entry) (Field, error) {
	ft, err := tr.typeOf(c)
	if err != nil {
		return Field{}, err
	}
	f := Field{Type: ft}
	f.Name, _ = c.Val(dwarf.AttrName).(string)
	if c.Tag == dwarf.TagInheritance {
		f.Name = "<base " + ft.Name + ">"
	}
	switch loc := c.Val(dwarf.AttrDataMemberLoc).(type) {
	case int64:
		f.Off = loc
	case []byte:
		return Field{}, fmt.Errorf("%s: member %s has a computed location (a virtual base)", t.Name, f.Name)
	}
	bs, _ := c.Val(dwarf.AttrBitSize).(int64)
	if bs <= 0 {
		return f, nil
	}
	f.BitSize = bs
	unit := ft.Size
	if unit <= 0 {
		return Field{}, fmt.Errorf("%s: bit-field %s of unsized type", t.Name, f.Name)
	}
	if dbo, ok := c.Val(dwarf.AttrDataBitOffset).(int64); ok {
		// DWARF 4+: bits from the start of the aggregate. Keep it as an
		// offset into the storage unit of the field's type that holds it.
		f.Off = dbo / 8 / unit * unit
		f.BitOff = dbo - f.Off*8
	} else if bo, ok := c.Val(dwarf.AttrBitOffset).(int64); ok {
		// DWARF 2/3: from the most significant bit of the storage unit at
		// DW_AT_data_member_location.
		if u, ok := c.Val(dwarf.AttrByteSize).(int64); ok && u > 0 {
			unit = u
		}
		f.BitOff = unit*8 - bo - bs
	}
	return f, nil
}
