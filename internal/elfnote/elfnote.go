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
	align := func(n uint64) uint64 { return (n + 3) &^ 3 }
	d := notes
	for len(d) >= 12 {
		namesz, descsz, typ := uint64(bo.Uint32(d)), uint64(bo.Uint32(d[4:])), bo.Uint32(d[8:])
		d = d[12:]
		nameEnd, descEnd := align(namesz), align(descsz)
		if nameEnd > uint64(len(d)) || descEnd > uint64(len(d))-nameEnd {
			return ""
		}
		name, desc := d[:namesz], d[nameEnd:nameEnd+descsz]
		if typ == ntGNUBuildID && bytes.Equal(bytes.TrimRight(name, "\x00"), []byte("GNU")) && len(desc) > 0 {
			return hex.EncodeToString(desc)
		}
		d = d[nameEnd+descEnd:]
	}
	return ""
}
