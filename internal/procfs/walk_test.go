package procfs

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// TestWalkLikeOpen: Walk reaches the file open(2) reaches, through
// relative and absolute links, "..", a link to a directory, /proc's magic
// links and a link chain; a missing last component is File -1, a missing
// directory, a loop and "file/" are errors as for open.
func TestWalkLikeOpen(t *testing.T) {
	base := t.TempDir()
	mk := func(p string) string { p = filepath.Join(base, p); must(t, os.MkdirAll(p, 0o755)); return p }
	a, b := mk("a"), mk("a/b")
	file := filepath.Join(b, "file")
	must(t, os.WriteFile(file, []byte("x"), 0o644))
	ln := func(to, name string) string { p := filepath.Join(base, name); must(t, os.Symlink(to, p)); return p }
	rel := ln("a/b/file", "rel")
	abs := ln(file, "abs")
	dirLink := ln("a/b", "dirlink")
	chain := ln("rel", "chain")
	up := ln("../a/b/../b/file", "a/up")
	loop := ln("loop", "loop")
	f, err := os.Open(file)
	must(t, err)
	defer f.Close()
	magic := "/proc/self/fd/" + itoa(int(f.Fd()))
	for _, p := range []string{file, rel, abs, filepath.Join(dirLink, "file"), chain, up, a + "/../a/b/./file", magic, "/proc/self/exe", "/dev/stdin", "/", b + "/"} {
		var want unix.Stat_t
		if err := unix.Stat(p, &want); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		e, err := Walk(p)
		if err != nil {
			t.Errorf("Walk(%s): %v", p, err)
			continue
		}
		var got unix.Stat_t
		must(t, unix.Fstat(e.File, &got))
		if got.Dev != want.Dev || got.Ino != want.Ino {
			t.Errorf("Walk(%s) reached %d:%d, open reaches %d:%d", p, got.Dev, got.Ino, want.Dev, want.Ino)
		}
		e.Close()
	}
	if e, err := Walk(filepath.Join(dirLink, "new")); err != nil || e.File != -1 || e.Name != "new" || e.Path != filepath.Join(b, "new") {
		t.Errorf("Walk of a file to create: %+v, %v", e, err)
	} else {
		e.Close()
	}
	for _, c := range []struct {
		path string
		want error
	}{{filepath.Join(base, "none", "x"), unix.ENOENT}, {loop, unix.ELOOP}, {file + "/", unix.ENOTDIR}, {filepath.Join(file, "x"), unix.ENOTDIR}} {
		if _, err := Walk(c.path); !errors.Is(err, c.want) {
			t.Errorf("Walk(%s): %v, want %v", c.path, err, c.want)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
