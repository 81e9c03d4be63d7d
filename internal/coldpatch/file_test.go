package coldpatch

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/elfscan"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// allocated runs fn and returns how many bytes the Go heap allocated meanwhile.
func allocated(fn func()) uint64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	fn()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// TestLargeNonELF: a 3 GB file that is not an x86-64 ELF object (sparse,
// so it costs no disk) is refused from its header, without reading the
// rest: the run allocates kilobytes, not the file's size (issue 11: 6.3 GB
// and 394 s before "no ELF magic"). Also a valid header whose section
// table lies past the end of the file.
func TestLargeNonELF(t *testing.T) {
	const size = 3 << 30
	real := testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}})
	head := mustRead(t, real.Path)[:64]
	badTable := append([]byte(nil), head...)
	badTable[40+7] = 0x40 // e_shoff far beyond the end of the file
	cases := []struct {
		name string
		head []byte
		want error
	}{
		{"text", []byte("#!/bin/sh\n# not a binary\n"), elfscan.ErrNotELF},
		{"aarch64 header", append(append([]byte(nil), head[:18]...), append([]byte{183, 0}, head[20:]...)...), elfscan.ErrNotX86_64},
		{"section table past the end", badTable, elfscan.ErrTruncated},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "big")
			f, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write(c.head); err != nil {
				t.Fatal(err)
			}
			if err := f.Truncate(size); err != nil {
				testutil.Unavailable(t, "sparse 3 GB file: %v", err)
			}
			f.Close()
			var runErr error
			n := allocated(func() { _, runErr = Run(p, Options{}) })
			if !errors.Is(runErr, c.want) {
				t.Fatalf("Run = %v, want %v", runErr, c.want)
			}
			if n > 16<<20 {
				t.Errorf("refusing a %d-byte file allocated %d bytes: it was read", size, n)
			}
			if st, _ := os.Stat(p); st.Size() != size {
				t.Error("the file changed")
			}
		})
	}
}

// TestOwnerSymlinkHardLink: in place, coldpatch behaves like a careful
// strip: a file owned by another user keeps its owner, group and mode
// (set-id bit included) when root rewrites it; a symlink is followed and
// its target patched while the link stays a link; a file with other hard
// links is refused, naming the link count, untouched.
func TestOwnerSymlinkHardLink(t *testing.T) {
	other := testutil.OtherUser(t)
	build := func() string {
		fx := testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}})
		dir := t.TempDir()
		p := filepath.Join(dir, "bin")
		if err := os.WriteFile(p, mustRead(t, fx.Path), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cold := func(t *testing.T, p string) {
		t.Helper()
		res, _, err := elfscan.ScanReader(bytes.NewReader(mustRead(t, p)), int64(len(mustRead(t, p))), p, elfscan.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, pr := range res.Probes {
			if pr.Placeholder != probelist.PlaceholderFlip || !bytes.Equal(mustRead(t, p)[pr.Offset:int(pr.Offset)+len(pr.Inert)], pr.Inert) {
				t.Fatalf("%s: probe %d is not inert", p, pr.ID)
			}
		}
	}

	t.Run("owner", func(t *testing.T) {
		p := build()
		if err := os.Chown(p, int(other.UID), int(other.GID)); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o751|os.ModeSetgid); err != nil {
			t.Fatal(err)
		}
		if _, err := Run(p, Options{}); err != nil {
			t.Fatal(err)
		}
		st, _ := os.Stat(p)
		sys := st.Sys().(*syscall.Stat_t)
		if sys.Uid != other.UID || sys.Gid != other.GID {
			t.Errorf("owner %d:%d after the rewrite, want %d:%d", sys.Uid, sys.Gid, other.UID, other.GID)
		}
		if st.Mode()&(os.ModePerm|os.ModeSetgid) != 0o751|os.ModeSetgid {
			t.Errorf("mode %v after the rewrite, want %v", st.Mode(), 0o751|os.ModeSetgid)
		}
		cold(t, p)
	})
	t.Run("symlink", func(t *testing.T) {
		p := build()
		link := filepath.Join(t.TempDir(), "link")
		if err := os.Symlink(p, link); err != nil {
			t.Fatal(err)
		}
		res, err := Run(link, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if lst, _ := os.Lstat(link); lst.Mode()&os.ModeSymlink == 0 {
			t.Error("the symlink was replaced by a regular file")
		}
		cold(t, p)
		if res.List.Binary.Path != p {
			t.Errorf("the list names %s, want the file patched, %s", res.List.Binary.Path, p)
		}
	})
	t.Run("hard link", func(t *testing.T) {
		p := build()
		other := filepath.Join(filepath.Dir(p), "other-name")
		if err := os.Link(p, other); err != nil {
			t.Fatal(err)
		}
		before := mustRead(t, p)
		_, err := Run(p, Options{})
		if !errors.Is(err, ErrHardLinks) || !strings.Contains(err.Error(), "has 2 links") {
			t.Fatalf("Run = %v, want ErrHardLinks naming 2 links", err)
		}
		if !bytes.Equal(mustRead(t, p), before) {
			t.Error("a refused run changed the file")
		}
		if ents, _ := os.ReadDir(filepath.Dir(p)); len(ents) != 2 {
			t.Errorf("files left behind: %v", ents)
		}
		// A copy is the way out.
		out := filepath.Join(t.TempDir(), "cold")
		if _, err := Run(p, Options{Output: out}); err != nil {
			t.Fatal(err)
		}
		cold(t, out)
	})
}

// TestRunNotAFile: a binary path naming a FIFO (nobody writes it), a
// device, or a link to one is refused in one error, at once, and nothing of
// it is opened for reading. Before, os.Open waited forever on the FIFO (an
// open for reading waits for a writer) and called the device's open; the
// regular-file check came after.
func TestRunNotAFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "app")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink("/dev/zero", link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fifo, "/dev/zero", link} {
		done := make(chan error, 1)
		go func() {
			_, err := Run(p, Options{DryRun: true})
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, procfs.ErrNotRegular) {
				t.Errorf("%s: %v, want a not-a-regular-file error", p, err)
			}
		case <-time.After(10 * time.Second): // a bound: a refusal takes microseconds
			// Let the blocked open go (a writer for the FIFO) so the
			// test binary is not left with a stuck goroutine.
			if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				w.Close()
			}
			t.Errorf("%s: coldpatch still waiting after 10 s (in the open)", p)
		}
	}
}

// TestRunPlantedLink: root runs coldpatch on a path in a sticky directory
// every user may write (/tmp), where another user put a symbolic link to a
// file root owns (an instrumented program). Before, the link was followed
// and root's file rewritten in place; now the run is refused with
// ErrPlantedLink and the file is untouched. A link root owns there, and a
// link elsewhere, are still followed.
func TestRunPlantedLink(t *testing.T) {
	other := testutil.OtherUser(t)
	bin := testutil.Build(t, testutil.Spec{Sources: []string{"mt.c"}}).Path
	victim := filepath.Join(t.TempDir(), "victim") // root's, in a root-only directory
	testutil.CopyInto(t, bin, filepath.Dir(victim))
	if err := os.Rename(filepath.Join(filepath.Dir(victim), filepath.Base(bin)), victim); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(victim)
	if err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp("", "edgeprobe-planted-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(tmp, "app")
	if out, err := testutil.CombinedOutputBound(other.Command("ln", "-s", victim, link)); err != nil {
		t.Fatalf("ln -s as %s: %v: %s", other.Name, err, out)
	}
	if _, err := Run(link, Options{}); !errors.Is(err, ErrPlantedLink) {
		t.Errorf("coldpatch %s (%s's link to root's file): %v; want ErrPlantedLink", link, other.Name, err)
	}
	if after, _ := os.ReadFile(victim); !bytes.Equal(after, before) {
		t.Errorf("root's file was rewritten through the other user's link")
	}
	// Root's own link in the same directory is followed.
	own := filepath.Join(tmp, "own")
	if err := os.Symlink(victim, own); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(own, Options{DryRun: true}); err != nil {
		t.Errorf("coldpatch --dry-run through root's own link: %v", err)
	}
}

// TestOutputPlanted: root's `coldpatch BINARY -o /tmp/NAME` where another
// user got to NAME first. A link there (to a file of root's) would have the
// output's rename replace the file it names; a file of theirs would stay
// theirs (an existing output keeps its owner), so they could rewrite root's
// cold binary before it runs. Both are refused in one error, nothing is
// written; root's own link and root's own file in the same place are used.
func TestOutputPlanted(t *testing.T) {
	other := testutil.OtherUser(t)
	bin := testutil.Build(t, testutil.Spec{Sources: []string{"mt.c"}}).Path
	victim := filepath.Join(t.TempDir(), "victim") // root's, in a root-only directory
	if err := os.WriteFile(victim, []byte("root's file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp("", "edgeprobe-planted-out-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	as := func(args ...string) {
		t.Helper()
		if out, err := testutil.CombinedOutputBound(other.Command(args[0], args[1:]...)); err != nil {
			t.Fatalf("%v as %s: %v: %s", args, other.Name, err, out)
		}
	}
	link, file := filepath.Join(tmp, "link.cold"), filepath.Join(tmp, "file.cold")
	as("ln", "-s", victim, link)
	as("sh", "-c", `echo theirs > "$0"`, file)
	if _, err := Run(bin, Options{Output: link}); !errors.Is(err, ErrPlantedLink) {
		t.Errorf("-o %s (%s's link to root's file): %v; want ErrPlantedLink", link, other.Name, err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "root's file\n" {
		t.Errorf("root's file was replaced through the other user's link (%d bytes now, starting %q)", len(b), b[:min(len(b), 4)])
	}
	if _, err := Run(bin, Options{Output: file}); !errors.Is(err, ErrOthersOutput) {
		t.Errorf("-o %s (%s's file): %v; want ErrOthersOutput", file, other.Name, err)
	}
	if b, _ := os.ReadFile(file); string(b) != "theirs\n" {
		t.Errorf("the other user's file was replaced (%d bytes now, starting %q)", len(b), b[:min(len(b), 4)])
	}
	// Root's own link and own file there are written.
	own, ownLink := filepath.Join(tmp, "own.cold"), filepath.Join(tmp, "ownlink.cold")
	if err := os.WriteFile(own, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(own, ownLink); err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{own, ownLink} {
		if res, err := Run(bin, Options{Output: out}); err != nil || !res.Written {
			t.Errorf("-o %s (root's own): %v, written %v", out, err, res != nil && res.Written)
		}
	}
	if b, _ := os.ReadFile(own); !bytes.HasPrefix(b, []byte("\x7fELF")) {
		t.Errorf("root's own output is not the cold binary (%d bytes)", len(b))
	}
}

// TestLinkSwapRace: with fs.protected_symlinks off, another user swaps a
// directory of theirs in /tmp with their link to a directory of root's
// while root runs coldpatch on their binary in place, and with -o into
// their directory. Each run must patch the other user's file or refuse the
// planted link (ErrPlantedLink); root's binary and root's file of the
// output's name, in the directory the link names, must never change and no
// temporary may appear there. Before (D99), the links were checked by one
// walk (CheckLinks) and the paths used by another (EvalSymlinks, the open,
// the temporary's create, the rename): a swap in between was followed. The
// loop is bounded by runs, not time.
func TestLinkSwapRace(t *testing.T) {
	other := testutil.OtherUser(t)
	bin := testutil.Build(t, testutil.Spec{Sources: []string{"mt.c"}}).Path
	hot := mustRead(t, bin)
	s := testutil.StartLinkSwap(t, other, 1<<40)
	victim, victimOut := filepath.Join(s.Victim, "app"), filepath.Join(s.Victim, "out.cold")
	if err := os.WriteFile(victim, hot, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(victimOut, []byte("root's file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	in, out := filepath.Join(s.Path, "app"), filepath.Join(s.Path, "out.cold")
	runs := map[string][2]int{}
	count := func(name string, err error) {
		t.Helper()
		n := runs[name]
		switch {
		case err == nil:
			n[0]++
		case errors.Is(err, ErrPlantedLink):
			n[1]++
		default:
			t.Fatalf("%s: %v; want a run or ErrPlantedLink", name, err)
		}
		runs[name] = n
	}
	for i := 0; i < 150; i++ {
		if err := os.WriteFile(filepath.Join(s.Real, "app"), hot, 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := Run(in, Options{})
		count("in place", err)
		_, err = Run(bin, Options{Output: out})
		count("-o", err)
		if !bytes.Equal(mustRead(t, victim), hot) {
			t.Fatalf("run %d: root's binary in the linked directory was rewritten through the swapped-in link (runs %v)", i, runs)
		}
		if b := mustRead(t, victimOut); string(b) != "root's file\n" {
			t.Fatalf("run %d: root's file in the linked directory was replaced through the swapped-in link (%d bytes, runs %v)", i, len(b), runs)
		}
		if ents, _ := os.ReadDir(s.Victim); len(ents) != 2 {
			t.Fatalf("run %d: %d entries in root's directory (a temporary put there?)", i, len(ents))
		}
	}
	t.Logf("runs (done, refused at the link): %v", runs)
	s.Check(t)
}
