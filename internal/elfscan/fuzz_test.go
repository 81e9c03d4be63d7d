package elfscan

import (
	"bytes"
	"testing"
)

// FuzzScan feeds arbitrary bytes to the scanner. It must not panic, and a
// probe list it returns must be valid and describe bytes that are really
// at each probe's offset.
func FuzzScan(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		l, _, err := ScanReader(bytes.NewReader(data), int64(len(data)), "fuzz.elf", Options{})
		if err != nil {
			return
		}
		if err := l.Validate(); err != nil {
			t.Fatal(err)
		}
		for _, p := range l.Probes {
			at := data[p.Offset : int(p.Offset)+len(p.Active)]
			if !bytes.Equal(at, p.Active) && !bytes.Equal(at, p.Inert) {
				t.Fatalf("probe %d: file has % x, active % x, inert % x", p.ID, at, p.Active, p.Inert)
			}
		}
	})
}

// FuzzEhFrame feeds arbitrary section contents to the .eh_frame parser.
func FuzzEhFrame(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, addr uint64) {
		fdes, err := parseEhFrame(data, addr, ehBases{text: 0x1000, data: 0x4000})
		if err != nil {
			return
		}
		for _, d := range fdes {
			if d.end <= d.start {
				t.Fatalf("empty or inverted FDE %#x-%#x", d.start, d.end)
			}
		}
	})
}
