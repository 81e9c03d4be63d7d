package elfsafe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// MaxObjectBytes bounds the bytes of one object file hotpatch reads: what
// its ELF headers describe (Extent). Shipped executables and libraries are
// far smaller; a build with full debug info of the largest programs we
// know of stays under it.
const MaxObjectBytes = 2 << 30

// ErrTooLarge: an object whose headers describe more than MaxObjectBytes.
var ErrTooLarge = errors.New("object larger than hotpatch reads")

// Extent returns how many bytes from the start of the object r (size bytes
// long) its ELF headers describe: the ELF header, the program and section
// header tables, and the file bytes of every segment and section, each
// cut at size. Bytes after that are nobody's (no loader or reader uses
// them) and are not read. A file that is not ELF64 describes its first 64
// bytes at most (enough for a reader to say what it is). An extent past
// MaxObjectBytes is ErrTooLarge.
//
// Why (review6, D88 addendum): the scan read every mapped object whole
// (and twice), and an object's file may be another user's: a program whose
// executable carried a 1 GiB sparse tail (20 KB on disk, the program runs
// as usual) made root's `hotpatch --enable` take 24 s and 2.1 GB; 20 GiB
// would have taken the machine's memory. A tail put under a section or
// segment header instead is read, up to MaxObjectBytes.
func Extent(r io.ReaderAt, size int64) (int64, error) {
	if size < 64 {
		return size, nil
	}
	var h [64]byte
	if _, err := r.ReadAt(h[:], 0); err != nil {
		return 0, err
	}
	if string(h[:4]) != "\x7fELF" || h[4] != 2 || h[5] != 1 { // ELFCLASS64, little-endian
		return 64, nil
	}
	le := binary.LittleEndian
	phoff, shoff := le.Uint64(h[32:]), le.Uint64(h[40:])
	phentsize, phnum := uint64(le.Uint16(h[54:])), uint64(le.Uint16(h[56:]))
	shentsize, shnum := uint64(le.Uint16(h[58:])), uint64(le.Uint16(h[60:]))
	usize := uint64(size)
	ext := uint64(64)
	// end extends ext to off+n, cut at the file's size.
	end := func(off, n uint64) {
		e := off + n
		if e < off || e > usize {
			e = usize
		}
		if e > ext {
			ext = e
		}
	}
	// Extended numbering: the counts in section header 0.
	if shoff != 0 && shentsize == 64 && (shnum == 0 || phnum == 0xffff) {
		var s0 [64]byte
		if _, err := r.ReadAt(s0[:], int64(shoff)); err == nil && shoff < usize {
			if shnum == 0 {
				shnum = le.Uint64(s0[32:])
			}
			if phnum == 0xffff {
				phnum = uint64(le.Uint32(s0[44:]))
			}
		}
	}
	if phnum > 0 && phentsize == 56 {
		end(phoff, phnum*56)
		if err := eachEntry(r, phoff, phnum, 56, usize, func(e []byte) {
			end(le.Uint64(e[8:]), le.Uint64(e[32:])) // p_offset, p_filesz
		}); err != nil {
			return 0, err
		}
	}
	if shnum > 0 && shentsize == 64 {
		end(shoff, shnum*64)
		if err := eachEntry(r, shoff, shnum, 64, usize, func(e []byte) {
			if t := le.Uint32(e[4:]); t != 8 && t != 0 { // SHT_NOBITS, SHT_NULL hold no bytes
				end(le.Uint64(e[24:]), le.Uint64(e[32:])) // sh_offset, sh_size
			}
		}); err != nil {
			return 0, err
		}
	}
	if ext > MaxObjectBytes {
		return 0, fmt.Errorf("its headers describe %d bytes, more than %d: %w", ext, MaxObjectBytes, ErrTooLarge)
	}
	return int64(ext), nil
}

// eachEntry calls fn with each of the n entries of size sz of the table at
// off, those wholly inside the file (a table running past it is the ELF
// readers' to report).
func eachEntry(r io.ReaderAt, off, n, sz, size uint64, fn func([]byte)) error {
	if off >= size || n > (size-off)/sz {
		if off >= size {
			return nil
		}
		n = (size - off) / sz
	}
	if n*sz > MaxObjectBytes {
		return fmt.Errorf("a header table of %d entries: %w", n, ErrTooLarge)
	}
	buf := make([]byte, 4096*sz)
	for i := uint64(0); i < n; {
		k := min(n-i, 4096)
		b := buf[:k*sz]
		if _, err := r.ReadAt(b, int64(off+i*sz)); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		for j := uint64(0); j < k; j++ {
			fn(b[j*sz : (j+1)*sz])
		}
		i += k
	}
	return nil
}

// ReadObject reads what Extent describes of the open object file f: the
// bytes the ELF readers may use, never a tail nothing describes.
func ReadObject(f *os.File) ([]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	n, err := Extent(f, st.Size())
	if err != nil {
		return nil, err
	}
	data := make([]byte, n)
	if k, err := f.ReadAt(data, 0); k < len(data) {
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return data, nil
}
