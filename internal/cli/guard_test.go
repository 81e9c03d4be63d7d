package cli

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestGuardMapped: a read of a file mapping whose file was truncated under
// it (SIGBUS) is an error of the guarded function, not the crash of the
// whole program ("fatal error: fault"), which it was before guardMapped;
// a panic of another kind goes on as a panic.
func TestGuardMapped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "region")
	if err := os.WriteFile(path, make([]byte, 2*os.Getpagesize()), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem, err := syscall.Mmap(int(f.Fd()), 0, 2*os.Getpagesize(), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	read := func() (err error) {
		defer guardMapped(path, &err)()
		guardSink = mem[os.Getpagesize()] // past the file's end now: SIGBUS
		return nil
	}
	if err := read(); err == nil || !strings.Contains(err.Error(), "shrank while it was read") {
		t.Errorf("a read past the truncated file's end: %v, want the file named as shrunk", err)
	}
	other := func() (err error) {
		defer guardMapped(path, &err)()
		panic("not a fault")
	}
	defer func() {
		if r := recover(); r != "not a fault" {
			t.Errorf("another panic: recovered %v", r)
		}
	}()
	other()
	t.Error("another panic was swallowed")
}

var guardSink byte
