package inject

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMemfdChecks drives both ways fillMemfd takes a descriptor (the
// program's own open file, and the checked path where pidfd_getfd is
// missing) on descriptors of this process: the load's new memfd is filled;
// a file put in its place (O_PATH, as a hostile program would), a memfd of
// another name and one of the right name that is not new are refused with
// ErrMemfdReplaced, and nothing is written to any of them.
func TestMemfdChecks(t *testing.T) {
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	newMemfd := func(name string, content []byte) int {
		fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		if len(content) > 0 {
			if _, err := unix.Write(fd, content); err != nil {
				t.Fatal(err)
			}
		}
		return fd
	}
	opath := func() int {
		fd, err := unix.Open(victim, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	ways := map[string]func(pid, fd int) (*os.File, error){"getfd": memfdOf, "path": memfdByPath}
	for way, open := range ways {
		t.Run(way, func(t *testing.T) {
			fd := newMemfd(memfdName, nil)
			f, err := open(os.Getpid(), fd)
			if err != nil {
				t.Fatalf("the load's own memfd refused: %v", err)
			}
			if _, err := f.WriteAt([]byte("runtime"), 0); err != nil {
				t.Fatalf("writing the memfd: %v", err)
			}
			f.Close()
			for what, fd := range map[string]int{
				"an O_PATH descriptor of a file": opath(),
				"a memfd of another name":        newMemfd("other", nil),
				"a memfd that is not new":        newMemfd(memfdName, []byte("x")),
				"the memfd just filled":          fd,
			} {
				if f, err := open(os.Getpid(), fd); !errors.Is(err, ErrMemfdReplaced) {
					if f != nil {
						f.Close()
					}
					t.Errorf("%s: %v, want ErrMemfdReplaced", what, err)
				}
			}
			if b, _ := os.ReadFile(victim); string(b) != "kept" {
				t.Errorf("the file was written: %q", b)
			}
		})
	}
}
