package elfnote

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
)

// ntGNUBuildID is NT_GNU_BUILD_ID.
const ntGNUBuildID = 3

// BuildID returns the GNU build-id in a run of ELF notes as hex, or "" if
// there is none. A note whose sizes run past the data ends the search:
// notes are trusted no further than they are well-formed.
func BuildID(notes []byte, bo binary.ByteOrder) string {
	if desc := Find(notes, bo, "GNU", ntGNUBuildID); len(desc) > 0 {
		return hex.EncodeToString(desc)
	}
	return ""
}

// Find returns the descriptor of the first note named name (NUL padding
// ignored) of type typ with a non-empty descriptor, or nil; a note whose
// sizes run past the data ends the search.
func Find(notes []byte, bo binary.ByteOrder, name string, typ uint32) []byte {
	align := func(n uint64) uint64 { return (n + 3) &^ 3 }
	d := notes
	for len(d) >= 12 {
		namesz, descsz, t := uint64(bo.Uint32(d)), uint64(bo.Uint32(d[4:])), bo.Uint32(d[8:])
		d = d[12:]
		nameEnd, descEnd := align(namesz), align(descsz)
		if nameEnd > uint64(len(d)) || descEnd > uint64(len(d))-nameEnd {
			return nil
		}
		n, desc := d[:namesz], d[nameEnd:nameEnd+descsz]
		if t == typ && bytes.Equal(bytes.TrimRight(n, "\x00"), []byte(name)) && len(desc) > 0 {
			return desc
		}
		d = d[nameEnd+descEnd:]
	}
	return nil
}
