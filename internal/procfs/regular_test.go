package procfs

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestOpenRegular: a regular file opens and reads; a FIFO without a writer
// (an open would wait), a device, a link to a device and a directory are
// ErrNotRegular, and nothing of theirs is opened.
func TestOpenRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink("/dev/zero", link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fifo, "/dev/zero", link, dir} {
		f, err := OpenRegular(p)
		if err == nil {
			f.Close()
		}
		if !errors.Is(err, ErrNotRegular) {
			t.Errorf("%s: %v, want ErrNotRegular", p, err)
		}
	}
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(good, []byte("bytes"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := OpenRegular(good)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if b, err := io.ReadAll(f); err != nil || string(b) != "bytes" {
		t.Errorf("read %q, %v", b, err)
	}
	if _, err := OpenRegular(filepath.Join(dir, "none")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing: %v, want ErrNotExist", err)
	}
}
