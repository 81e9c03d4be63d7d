package inject

import (
	"bytes"
	"os"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// FuzzParseObject: a mapped object's file is input hotpatch did not write
// (a hand-edited library, a truncated file): parsing it gives an error or
// slots inside the file's own relocations, never a panic.
func FuzzParseObject(f *testing.F) {
	for _, spec := range []testutil.Spec{
		{Sources: []string{"lib.c"}, Shared: true, Name: "libfix.so"},
		{Sources: []string{"lib.c"}, Shared: true, NoPLT: true, Name: "libfix-noplt.so"},
	} {
		if b, err := os.ReadFile(testutil.Build(f, spec).Path); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, slots, _, err := parseObject(bytes.NewReader(data), "fuzz", 0x1000)
		if err != nil {
			return
		}
		for _, s := range slots {
			if hookIndex(s.Hook) < 0 {
				t.Fatalf("slot for %q, which is not a hook", s.Hook)
			}
		}
	})
}

// TestParseObjectSlots: a -finstrument-functions library reaches its hooks
// through JUMP_SLOT (PLT) relocations, built -fno-plt through GLOB_DAT ones.
func TestParseObjectSlots(t *testing.T) {
	for _, c := range []struct {
		spec testutil.Spec
		want string
	}{
		{testutil.Spec{Sources: []string{"lib.c"}, Shared: true, Name: "libfix.so"}, "JUMP_SLOT"},
		{testutil.Spec{Sources: []string{"lib.c"}, Shared: true, NoPLT: true, Name: "libfix-noplt.so"}, "GLOB_DAT"},
	} {
		b, err := os.ReadFile(testutil.Build(t, c.spec).Path)
		if err != nil {
			t.Fatal(err)
		}
		_, slots, _, err := parseObject(bytes.NewReader(b), c.spec.Name, 0)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, s := range slots {
			got[s.Hook] = s.Reloc
		}
		for _, h := range Hooks[:2] {
			if got[h] != c.want {
				t.Errorf("%s: %s through %q, want %s (slots %+v)", c.spec.Name, h, got[h], c.want, slots)
			}
		}
	}
}
