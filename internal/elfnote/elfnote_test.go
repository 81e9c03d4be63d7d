package elfnote

import (
	"encoding/binary"
	"testing"
)

func note(name string, typ uint32, desc []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(name)+1))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(desc)))
	b = binary.LittleEndian.AppendUint32(b, typ)
	b = append(b, name...)
	b = append(b, 0)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	b = append(b, desc...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func TestBuildID(t *testing.T) {
	id := []byte{0xde, 0xad, 0xbe, 0xef, 1}
	abi := note("GNU", 1, []byte{0, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0})
	cases := []struct {
		name  string
		notes []byte
		want  string
	}{
		{"build-id alone", note("GNU", 3, id), "deadbeef01"},
		{"after the ABI tag", append(abi, note("GNU", 3, id)...), "deadbeef01"},
		{"another vendor's type 3", note("Go", 3, id), ""},
		{"empty id", note("GNU", 3, nil), ""},
		{"none", abi, ""},
		{"truncated", note("GNU", 3, id)[:15], ""},
		{"empty", nil, ""},
	}
	for _, c := range cases {
		if got := BuildID(c.notes, binary.LittleEndian); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

func FuzzBuildID(f *testing.F) {
	f.Add(note("GNU", 3, []byte{1, 2, 3}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 3, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = BuildID(b, binary.LittleEndian) // must not panic
		_ = BuildID(b, binary.BigEndian)
	})
}

// TestFind: a note is found by name and type, after notes of other
// names or types; an empty descriptor or a note cut short is no match.
func TestFind(t *testing.T) {
	goID := []byte("actionID/contentID")
	notes := append(append(note("GNU", 3, []byte{1, 2, 3}), note("Go", 5, []byte("x"))...), note("Go", 4, goID)...)
	if got := Find(notes, binary.LittleEndian, "Go", 4); string(got) != string(goID) {
		t.Fatalf("Go build ID %q, want %q", got, goID)
	}
	if got := Find(notes, binary.LittleEndian, "GNU", 3); string(got) != "\x01\x02\x03" {
		t.Fatalf("GNU build-id %x", got)
	}
	if got := Find(note("Go", 4, nil), binary.LittleEndian, "Go", 4); got != nil {
		t.Fatalf("empty descriptor: %q", got)
	}
	if got := Find(notes[:len(notes)-4], binary.LittleEndian, "Go", 4); got != nil {
		t.Fatalf("cut short: %q", got)
	}
}
