package calltrace

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// TestPrintable: names a terminal would act on are escaped, others kept.
func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"handle_request":                      "handle_request",
		"ns::Foo<int>::operator()(int) const": "ns::Foo<int>::operator()(int) const",
		"grüße_日本":                            "grüße_日本",
		"ev\x1b]0;PWNED\x07il\x1b[2J":         `ev\x1b]0;PWNED\x07il\x1b[2J`,
		"a\nb\tc\rd\x7f":                      `a\x0ab\x09c\x0dd\x7f`,
		"csi\u009b31m":                        `csi\u009b31m`,
		"rtl\u202egnp.exe":                    `rtl\u202egnp.exe`,
		"bad\xff\xfeutf8":                     `bad\xff\xfeutf8`,
		"":                                    "",
	} {
		if got := Printable(in); got != want {
			t.Errorf("Printable(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzPrintable: what Printable returns is valid UTF-8 with no control or
// format character, and a string with none is returned unchanged.
func FuzzPrintable(f *testing.F) {
	f.Add("ev\x1b]0;x\x07")
	f.Add("plain_name")
	f.Add("\xc2\x9b\u202e\xff")
	f.Fuzz(func(t *testing.T, s string) {
		got := Printable(s)
		if !utf8.ValidString(got) {
			t.Fatalf("Printable(%q) = %q: not UTF-8", s, got)
		}
		for _, r := range got {
			if !unicode.IsPrint(r) && r != ' ' {
				t.Fatalf("Printable(%q) = %q keeps %U", s, got, r)
			}
		}
		if utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) && r != ' ' }) < 0 && got != s {
			t.Fatalf("Printable(%q) = %q changed a printable string", s, got)
		}
	})
}
