package probelist

import (
	"path"
	"testing"
)

// FuzzParseSelector: a selector the syntax check accepts never makes the
// match itself fail on a name (Match ignores path.Match's error: a pattern
// that only errs on some names would silently select nothing there), and
// selects the same probes whatever its kind when the kind is "both".
func FuzzParseSelector(f *testing.F) {
	for _, s := range []string{"work", "http_*", "*", "id:3", "[a-", "a[", "\\", "id:-1", "a[]b]"} {
		f.Add(s, "work")
	}
	f.Fuzz(func(t *testing.T, pattern, name string) {
		sel, err := ParseSelector(pattern, "")
		if err != nil {
			return
		}
		if _, merr := path.Match(sel.Pattern, name); merr != nil {
			t.Fatalf("selector %q accepted, but matching %q fails: %v", pattern, name, merr)
		}
		both, _ := ParseSelector(pattern, KindBoth)
		for _, k := range []string{KindEntry, KindExit} {
			p := &Probe{Function: name, Kind: k, Provider: ProviderCyg}
			if sel.Match(p) != both.Match(p) {
				t.Fatalf("selector %q: kind \"\" and both differ on %q %s", pattern, name, k)
			}
		}
	})
}
