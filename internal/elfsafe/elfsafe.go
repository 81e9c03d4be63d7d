package elfsafe

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// MaxInflate bounds a compressed section's declared size as a multiple of
// its bytes in the file. Debug info compresses three to eight times
// (zlib or zstd); zlib's own limit is about a thousand.
const MaxInflate = 64

// ErrInflated: a compressed section the file cannot honestly hold.
var ErrInflated = errors.New("compressed section inflates past what it holds")

// NewFile is elf.NewFile followed by Check, after Extent's bound when r
// tells its size (a file, a bytes.Reader, a SectionReader): debug/elf reads
// the section-name table whole when it opens a file, and the symbol tables
// when asked, whatever their headers declare.
func NewFile(r io.ReaderAt) (*elf.File, error) {
	if n, ok := sizeOf(r); ok {
		if _, err := Extent(r, n); err != nil {
			return nil, err
		}
	}
	f, err := elf.NewFile(r)
	if err != nil {
		return nil, err
	}
	if err := Check(f); err != nil {
		return nil, err
	}
	return f, nil
}

// Check refuses a file in which a compressed section is anything but
// program data (debug info: toolchains compress nothing else; a symbol,
// string, relocation or note table so marked is no loader's), declares
// more than MaxInflate times its bytes, or shares bytes with another
// compressed section. It reads at most a 12-byte header per .zdebug
// section, whose size debug/elf only learns when the section is read.
func Check(f *elf.File) error {
	type span struct{ off, end uint64 }
	var spans []span
	for _, s := range f.Sections {
		size, compressed := s.Size, s.Flags&elf.SHF_COMPRESSED != 0
		if !compressed && s.Type != elf.SHT_NOBITS && strings.HasPrefix(s.Name, ".zdebug") {
			var b [12]byte
			if n, _ := s.ReaderAt.ReadAt(b[:], 0); n == len(b) && string(b[:4]) == "ZLIB" {
				size, compressed = binary.BigEndian.Uint64(b[4:]), true
			}
		}
		if !compressed {
			continue
		}
		if s.Type != elf.SHT_PROGBITS {
			return fmt.Errorf("section %s (%v) is compressed, which no toolchain does to such a section: %w", s.Name, s.Type, ErrInflated)
		}
		if size/MaxInflate > s.FileSize {
			return fmt.Errorf("section %s declares %d bytes from %d in the file (more than %dx): %w", s.Name, size, s.FileSize, MaxInflate, ErrInflated)
		}
		spans = append(spans, span{s.Offset, s.Offset + s.FileSize})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].off < spans[j].off })
	for i := 1; i < len(spans); i++ {
		if spans[i].off < spans[i-1].end {
			return fmt.Errorf("compressed sections share the file's bytes at %#x: %w", spans[i].off, ErrInflated)
		}
	}
	return nil
}

// sizeOf is r's size, when r can tell it.
func sizeOf(r io.ReaderAt) (int64, bool) {
	switch v := r.(type) {
	case interface{ Size() int64 }:
		return v.Size(), true
	case interface{ Stat() (os.FileInfo, error) }:
		if st, err := v.Stat(); err == nil && st.Mode().IsRegular() {
			return st.Size(), true
		}
	}
	return 0, false
}
