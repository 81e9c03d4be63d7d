package calltrace

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Printable returns s with every character a terminal would act on instead
// of showing written as an escape: control characters (ESC, BEL, C1
// controls such as CSI), format characters (bidirectional overrides) and
// bytes that are not UTF-8 become \xNN or \uNNNN. Names shown to a person
// come from the traced program (its symbol table, DWARF, file names) or
// from a trace file, which another user may have written: printed raw,
// "\x1b]0;...\a" retitles the window, "\x1b[2J" clears it, OSC 52 writes
// the clipboard. A string that needs nothing is returned as it is.
func Printable(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			b.WriteString(`\x`)
			b.WriteString(hex2(s[i]))
		case r < 0x80 && (r < 0x20 || r == 0x7f):
			b.WriteString(`\x`)
			b.WriteString(hex2(byte(r)))
		case !unicode.IsPrint(r) && r != ' ':
			q := strconv.QuoteRuneToASCII(r) // '\u202e'
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

func hex2(c byte) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[c>>4], digits[c&15]})
}
