package capture

import (
	"encoding/binary"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/shm"
)

// FuzzRecords: whatever words a ring holds (the target's memory: a bug or
// a hostile process may have written anything), unpacking a record never
// panics, and what it returns stays within the bounds a capture copies.
func FuzzRecords(f *testing.F) {
	f.Add(shm.PlanSpec(0x3f, 0xff, 0x3f, 64, 3, 3)|shm.PlanRStr, []byte("0123456789abcdef0123456789abcdef"))
	f.Add(uint64(0xffffffffffffffff), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add(shm.PlanSpec(1, 0, 1, 0, 1, 0), []byte{1, 0, 0, 0, 0, 0, 0, 0, 0x40, 1, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, spec uint64, raw []byte) {
		words := make([]uint64, len(raw)/8)
		for i := range words {
			words[i] = binary.LittleEndian.Uint64(raw[8*i:])
		}
		if r, ok := entryRegs(spec, words); ok {
			if len(r.Stack) > 127 {
				t.Fatalf("%d stack bytes", len(r.Stack))
			}
			for _, s := range r.Str {
				if s != nil && len(s.Bytes) > shm.StrMax {
					t.Fatalf("a %d-byte string", len(s.Bytes))
				}
			}
		}
		if r, ok := exitRegs(spec, words); ok && r.Str != nil && len(r.Str.Bytes) > shm.StrMax {
			t.Fatalf("a %d-byte string", len(r.Str.Bytes))
		}
	})
}
