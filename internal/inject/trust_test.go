package inject_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/inject"
)

// TestReadRuntimeNotAFile: a runtime path naming a FIFO nobody writes, a
// device, or a link to one (the path may be in /tmp, where another user can
// put them) is refused as untrusted at once, and nothing of it is opened.
// Before, ReadRuntime's os.Open waited on the FIFO forever (hotpatch holding
// the target's lock meanwhile) and called the device's open; its regular-file
// check came after.
func TestReadRuntimeNotAFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "libedgeprobe.so")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.so")
	if err := os.Symlink("/dev/zero", link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fifo, "/dev/zero", link} {
		done := make(chan error, 1)
		go func() {
			_, err := inject.ReadRuntime(p, os.Getuid())
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, inject.ErrUntrusted) {
				t.Errorf("%s: %v, want ErrUntrusted", p, err)
			}
		case <-time.After(10 * time.Second): // a bound: a refusal takes microseconds
			if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				w.Close() // let the blocked open go
			}
			<-done
			t.Errorf("%s: ReadRuntime still waiting after 10 s (in the open)", p)
		}
	}
}
