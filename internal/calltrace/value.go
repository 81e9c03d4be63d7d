package calltrace

import (
	"strconv"
	"strings"
)

// ValueKind says which field of a Value holds it.
type ValueKind uint8

// Value kinds.
const (
	// Missing: not recorded; Note says why.
	Missing ValueKind = iota
	Int               // Int
	Uint              // Uint
	Bool              // Uint (0 or 1)
	Char              // Int: a C char
	Float             // Float (Float32: it was a float)
	Pointer           // Uint
	String            // Uint: the pointer; Str: the bytes read from it (see Note, Truncated)
	Enum              // Int; Str: the enumerator's name, if it has one
	Struct            // Fields, in declaration order
	Wide              // Str: the decimal text of an integer wider than 64 bits
)

// Value is one recorded argument or return value, typed from DWARF.
type Value struct {
	Name      string // parameter or member name; "" for a return value
	Type      string // C type as the program declares it, e.g. "const char *"
	Kind      ValueKind
	Int       int64
	Uint      uint64
	Float     float64
	Float32   bool
	Str       string
	Truncated bool // String: the copy stopped at its bound before a NUL
	Fields    []Value
	// Note says why a Missing value was not recorded, or, for a String,
	// why its bytes were not ("unreadable").
	Note string
}

// String renders the value the way the text view prints it:
// 42, 0x7f3a10, "GET /", 2.5, true, {x=1, y=2}, MODE_FAST, ?(why).
func (v Value) String() string {
	var b strings.Builder
	v.write(&b)
	return b.String()
}

func (v Value) write(b *strings.Builder) {
	switch v.Kind {
	case Missing:
		b.WriteString("?")
		if v.Note != "" {
			b.WriteString("(" + Printable(v.Note) + ")")
		}
	case Int:
		b.WriteString(strconv.FormatInt(v.Int, 10))
	case Uint:
		b.WriteString(strconv.FormatUint(v.Uint, 10))
	case Bool:
		b.WriteString(strconv.FormatBool(v.Uint != 0))
	case Char:
		if v.Int >= 0x20 && v.Int < 0x7f {
			b.WriteString(strconv.QuoteRune(rune(v.Int)))
		} else {
			b.WriteString(strconv.FormatInt(v.Int, 10))
		}
	case Float:
		bits := 64
		if v.Float32 {
			bits = 32
		}
		b.WriteString(strconv.FormatFloat(v.Float, 'g', -1, bits))
	case Pointer:
		b.WriteString(Hex(v.Uint))
	case String:
		switch {
		case v.Uint == 0:
			b.WriteString("NULL")
		case v.Note != "":
			b.WriteString(Hex(v.Uint) + " (" + Printable(v.Note) + ")")
		default:
			b.WriteString(strconv.Quote(v.Str))
			if v.Truncated {
				b.WriteString("...")
			}
		}
	case Enum:
		if v.Str != "" {
			b.WriteString(Printable(v.Str))
		} else {
			b.WriteString(strconv.FormatInt(v.Int, 10))
		}
	case Wide:
		b.WriteString(Printable(v.Str))
	case Struct:
		b.WriteString("{")
		for i, f := range v.Fields {
			if i > 0 {
				b.WriteString(", ")
			}
			if f.Name != "" {
				b.WriteString(Printable(f.Name) + "=")
			}
			f.write(b)
		}
		b.WriteString("}")
	}
}

// Hex renders an address: NULL for 0, else 0x followed by hex digits.
func Hex(u uint64) string {
	if u == 0 {
		return "NULL"
	}
	return "0x" + strconv.FormatUint(u, 16)
}

// FormatCall renders a call the way uftrace does: name(a=1, s="x"), for a
// person: names are Printable.
func FormatCall(name string, args []Value) string {
	var b strings.Builder
	b.WriteString(Printable(name))
	b.WriteString("(")
	for i, a := range args {
		if i > 0 {
			b.WriteString(", ")
		}
		if a.Name != "" {
			b.WriteString(Printable(a.Name) + "=")
		}
		a.write(&b)
	}
	b.WriteString(")")
	return b.String()
}
