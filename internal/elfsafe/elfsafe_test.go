package elfsafe_test

import (
	"bytes"
	"compress/zlib"
	"debug/elf"
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/elfsafe"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// inflate returns a zlib stream of n zero bytes.
func inflate(t testing.TB, n int) []byte {
	t.Helper()
	var b bytes.Buffer
	w, _ := zlib.NewWriterLevel(&b, zlib.BestCompression)
	zero := make([]byte, 1<<20)
	for n > 0 {
		k := min(n, len(zero))
		if _, err := w.Write(zero[:k]); err != nil {
			t.Fatal(err)
		}
		n -= k
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// Section names the section (by name) to rewrite and how.
type Section struct {
	Name     string
	Type     elf.SectionType // 0: keep
	Declared uint64          // the size its compression header declares
	Stream   []byte          // its compressed bytes, appended to the file
	Zdebug   bool            // the .zdebug form ("ZLIB" + big-endian size), not SHF_COMPRESSED
	SameAs   string          // point it at that section's (rewritten) bytes instead
}

// Rewrite returns a copy of the ELF64 file data with each section of ss
// made compressed as it says: its bytes appended at the end, its header
// pointed at them. The program headers are not touched, so a program so
// rewritten still runs.
func Rewrite(t testing.TB, data []byte, ss ...Section) []byte {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	out := append([]byte(nil), data...)
	le := binary.LittleEndian
	shoff, shentsize := le.Uint64(out[0x28:]), uint64(le.Uint16(out[0x3a:]))
	at := map[string][2]uint64{}
	for _, s := range ss {
		idx := -1
		for i, sec := range f.Sections {
			if sec.Name == s.Name {
				idx = i
			}
		}
		if idx < 0 {
			t.Fatalf("no section %s", s.Name)
		}
		h := shoff + uint64(idx)*shentsize
		off, size := uint64(len(out)), uint64(0)
		if s.SameAs != "" {
			off, size = at[s.SameAs][0], at[s.SameAs][1]
		} else {
			var payload []byte
			if s.Zdebug {
				payload = append([]byte("ZLIB"), binary.BigEndian.AppendUint64(nil, s.Declared)...)
			} else {
				payload = le.AppendUint32(payload, 1) // ELFCOMPRESS_ZLIB
				payload = le.AppendUint32(payload, 0)
				payload = le.AppendUint64(payload, s.Declared)
				payload = le.AppendUint64(payload, 1)
			}
			payload = append(payload, s.Stream...)
			out = append(out, payload...)
			size = uint64(len(payload))
		}
		at[s.Name] = [2]uint64{off, size}
		if s.Type != 0 {
			le.PutUint32(out[h+4:], uint32(s.Type))
		}
		flags := le.Uint64(out[h+8:]) &^ uint64(elf.SHF_ALLOC)
		if !s.Zdebug {
			flags |= uint64(elf.SHF_COMPRESSED)
		}
		le.PutUint64(out[h+8:], flags)
		le.PutUint64(out[h+24:], off)
		le.PutUint64(out[h+32:], size)
	}
	return out
}

// TestCheck: a real file with compressed debug info passes (mt.c built by
// gcc with -gz=zlib, and with -gz=zlib-gnu: .zdebug sections); a section declaring far
// more than it holds, a compressed symbol table, two compressed sections
// on the same bytes and a .zdebug section declaring too much are refused
// with ErrInflated, before anything is inflated.
func TestCheck(t *testing.T) {
	var self []byte
	for _, gz := range []string{"-gz=zlib", "-gz=zlib-gnu"} {
		fx := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"mt.c"}, Flags: []string{gz}})
		data, err := os.ReadFile(fx.Path)
		if err != nil {
			t.Fatal(err)
		}
		f, err := elfsafe.NewFile(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("gcc %s: %v", gz, err)
		}
		compressed, most := 0, 0.0
		for _, s := range f.Sections {
			if s.Flags&elf.SHF_COMPRESSED != 0 || strings.HasPrefix(s.Name, ".zdebug") {
				b, err := s.Data() // inflated: Size is known now for .zdebug too
				if err != nil {
					t.Fatalf("gcc %s: %s: %v", gz, s.Name, err)
				}
				compressed++
				most = max(most, float64(len(b))/float64(s.FileSize))
			}
		}
		if compressed == 0 {
			t.Fatalf("gcc %s made no compressed section: the check is not exercised on a real one", gz)
		}
		t.Logf("gcc %s: %d compressed sections, at most %.1fx", gz, compressed, most)
		if self == nil {
			self = data
		}
	}
	small := inflate(t, 1<<20) // about a kilobyte
	for what, ss := range map[string][]Section{
		"1 MiB from a kilobyte":          {{Name: ".debug_info", Declared: 1 << 20, Stream: small}},
		"a symbol table compressed":      {{Name: ".debug_info", Type: elf.SHT_SYMTAB, Declared: 4096, Stream: inflate(t, 4096)}},
		"two sections on the same bytes": {{Name: ".debug_info", Declared: 4096, Stream: inflate(t, 4096)}, {Name: ".debug_line", SameAs: ".debug_info"}},
		".zdebug declaring 1 MiB":        {{Name: ".debug_info", Declared: 1 << 20, Stream: small, Zdebug: true}},
	} {
		if what == ".zdebug declaring 1 MiB" {
			// debug/elf recognises the form by its name only.
			renamed := bytes.Replace(self, []byte(".debug_info\x00"), []byte(".zdebug_inf\x00"), 1)
			for i := range ss {
				ss[i].Name = ".zdebug_inf"
			}
			if _, err := elfsafe.NewFile(bytes.NewReader(Rewrite(t, renamed, ss...))); !errors.Is(err, elfsafe.ErrInflated) {
				t.Errorf("%s: %v, want ErrInflated", what, err)
			}
			continue
		}
		if _, err := elfsafe.NewFile(bytes.NewReader(Rewrite(t, self, ss...))); !errors.Is(err, elfsafe.ErrInflated) {
			t.Errorf("%s: %v, want ErrInflated", what, err)
		}
	}
	// Within the bound: passes (and debug/elf reads it back).
	var b bytes.Buffer
	w := zlib.NewWriter(&b)
	noise := make([]byte, 4096)
	for i := range noise {
		noise[i] = byte(i*i*2654435761>>13) & 0x3f // compresses about 1.3x
	}
	w.Write(noise)
	w.Close()
	ok := Rewrite(t, self, Section{Name: ".debug_info", Declared: 4096, Stream: b.Bytes()})
	f, err := elfsafe.NewFile(bytes.NewReader(ok))
	if err != nil {
		t.Fatalf("4 KiB of zeros compressed: %v", err)
	}
	if b, err := f.Section(".debug_info").Data(); err != nil || len(b) != 4096 {
		t.Fatalf("reading it back: %d bytes, %v", len(b), err)
	}
}
