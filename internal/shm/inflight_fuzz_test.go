package shm

import (
	"bytes"
	"testing"
)

// FuzzInflightSites: the in-flight table's entries, read from a target's
// memory (whatever it holds), decode without panic into whole entries
// only; an entry hotpatch encodes decodes to what it wrote.
func FuzzInflightSites(f *testing.F) {
	f.Add([]byte{}, uint64(0x401000), []byte{0xe8, 1, 2, 3, 4}, []byte{0x0f, 0x1f, 0x44, 0, 0})
	f.Add(make([]byte, InflightSiteSize*2+7), uint64(1), []byte{1}, []byte{2})
	f.Fuzz(func(t *testing.T, raw []byte, addr uint64, active, inert []byte) {
		if got := DecodeInflightSites(raw); len(got) != len(raw)/InflightSiteSize {
			t.Fatalf("%d bytes decoded to %d entries", len(raw), len(got))
		}
		b, err := EncodeInflightSite(nil, addr, active, inert)
		if err != nil {
			if len(active) != 0 && len(active) == len(inert) && len(active) < SiteMax {
				t.Fatalf("valid forms refused: %v", err)
			}
			return
		}
		got := DecodeInflightSites(b)
		if len(got) != 1 || got[0].Addr != addr || int(got[0].Len) != len(active) ||
			!bytes.Equal(got[0].Active[:len(active)], active) || !bytes.Equal(got[0].Inert[:len(inert)], inert) {
			t.Fatalf("encoded %#x %x %x, decoded %+v", addr, active, inert, got)
		}
	})
}
