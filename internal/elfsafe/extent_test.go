package elfsafe_test

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/elfsafe"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestExtent: a linked program describes all of its bytes; a tail after it
// is nobody's; a section claiming more than MaxObjectBytes is ErrTooLarge,
// and so is NewFile of it; a file that is not ELF describes 64 bytes.
func TestExtent(t *testing.T) {
	for _, cc := range []string{"gcc", "clang"} {
		fx := testutil.Build(t, testutil.Spec{Compiler: cc, Opt: "-O2", Sources: []string{"mt.c"}})
		data, err := os.ReadFile(fx.Path)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := elfsafe.Extent(bytes.NewReader(data), int64(len(data))); err != nil || n != int64(len(data)) {
			t.Errorf("%s: Extent %d, %v; want the whole %d bytes", cc, n, err, len(data))
		}
		tailed := append(append([]byte(nil), data...), make([]byte, 1<<20)...)
		if n, err := elfsafe.Extent(bytes.NewReader(tailed), int64(len(tailed))); err != nil || n != int64(len(data)) {
			t.Errorf("%s with a tail: Extent %d, %v; want %d", cc, n, err, len(data))
		}
		// The claim is cut at the file's size: a big claim on a small file
		// is the ELF readers' to refuse (it runs past the end).
		claimed := claimTail(t, data, ".comment", 1<<40)
		if n, err := elfsafe.Extent(bytes.NewReader(claimed), int64(len(claimed))); err != nil || n != int64(len(claimed)) {
			t.Errorf("%s, a claim past the end: Extent %d, %v; want %d", cc, n, err, len(claimed))
		}
		// A reader of a file that large, without its bytes: a ReaderAt of
		// data followed by zeros.
		big := zeroTail{data}
		size := int64(len(data)) + elfsafe.MaxObjectBytes
		if _, err := elfsafe.Extent(zeroTail{claimed}, size); !errors.Is(err, elfsafe.ErrTooLarge) {
			t.Errorf("%s, a claim of more than MaxObjectBytes: %v, want ErrTooLarge", cc, err)
		}
		if _, err := elfsafe.NewFile(sized{zeroTail{claimed}, size}); !errors.Is(err, elfsafe.ErrTooLarge) {
			t.Errorf("%s, NewFile of a claim of more than MaxObjectBytes: %v, want ErrTooLarge", cc, err)
		}
		if n, err := elfsafe.Extent(big, size); err != nil || n != int64(len(data)) {
			t.Errorf("%s with a %d-byte tail: Extent %d, %v; want %d", cc, elfsafe.MaxObjectBytes, n, err, len(data))
		}
	}
	if n, err := elfsafe.Extent(bytes.NewReader(make([]byte, 4096)), 4096); err != nil || n != 64 {
		t.Errorf("not ELF: Extent %d, %v; want 64", n, err)
	}
}

// zeroTail reads as its bytes followed by zeros without end.
type zeroTail struct{ b []byte }

func (z zeroTail) ReadAt(p []byte, off int64) (int, error) {
	for i := range p {
		p[i] = 0
		if o := off + int64(i); o < int64(len(z.b)) {
			p[i] = z.b[o]
		}
	}
	return len(p), nil
}

// sized is a zeroTail that tells its size, as a file or a bytes.Reader does.
type sized struct {
	zeroTail
	n int64
}

func (s sized) Size() int64 { return s.n }
