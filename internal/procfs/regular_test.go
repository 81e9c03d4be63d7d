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

// TestOpenOwned (D93): our own file and FIFO open (the FIFO's open waits for
// its writer); a device, a link to one and a directory are ErrNotRegular; a
// file or FIFO another uid owns is ErrNotOwned (as root: chown).
func TestOpenOwned(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "cmds")
	if err := os.WriteFile(file, []byte("enable work\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := OpenOwned(file)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(f); string(b) != "enable work\n" {
		t.Errorf("read %q", b)
	}
	f.Close()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	wrote := make(chan error, 1)
	go func() {
		w, err := os.OpenFile(fifo, os.O_WRONLY, 0) // waits for OpenOwned's open
		if err == nil {
			_, err = w.WriteString("x\n")
			w.Close()
		}
		wrote <- err
	}()
	if f, err = OpenOwned(fifo); err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(f); string(b) != "x\n" {
		t.Errorf("FIFO: read %q", b)
	}
	f.Close()
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink("/dev/zero", link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/dev/zero", link, dir} {
		if f, err := OpenOwned(p); !errors.Is(err, ErrNotRegular) {
			if f != nil {
				f.Close()
			}
			t.Errorf("%s: %v, want ErrNotRegular", p, err)
		}
	}
	if os.Geteuid() != 0 {
		return // chown to another uid needs root
	}
	for _, p := range []string{file, fifo} {
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if f, err := OpenOwned(p); !errors.Is(err, ErrNotOwned) {
			if f != nil {
				f.Close()
			}
			t.Errorf("%s owned by uid 65534: %v, want ErrNotOwned", p, err)
		}
	}
}

// TestWalkPlanted: a link in a sticky world-writable directory owned by
// another uid (Lchown, as root) is ErrPlantedLink, also as a middle
// component and through a link of ours to it; our own link there, and the
// other uid's link in a directory that is not sticky, are followed.
func TestWalkPlanted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: Lchown to another uid") // the live tests (coldpatch, hotpatch) cover it in CI
	}
	base := t.TempDir()
	sticky := filepath.Join(base, "tmp")
	plain := filepath.Join(base, "plain")
	for _, d := range []string{sticky, plain} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(sticky, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(base, "file")
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	link := func(dir, name string, uid int, to string) string {
		p := filepath.Join(dir, name)
		if err := os.Symlink(to, p); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	planted := link(sticky, "planted", 65534, target)
	own := link(sticky, "own", 0, target)
	other := link(plain, "other", 65534, target)
	dirLink := link(sticky, "dir", 65534, base)
	viaOwn := link(plain, "via", 0, planted)
	for _, c := range []struct {
		path string
		bad  bool
	}{{planted, true}, {filepath.Join(dirLink, "file"), true}, {viaOwn, true}, {own, false}, {other, false}, {target, false}} {
		e, err := Walk(c.path)
		if err == nil {
			e.Close()
		}
		if c.bad != errors.Is(err, ErrPlantedLink) || !c.bad && err != nil {
			t.Errorf("%s: %v (want planted: %v)", c.path, err, c.bad)
		}
	}
}
