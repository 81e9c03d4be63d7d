package cli

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestOutputsKeepUmask: the files trace, profile and the probe-list
// writers make get 0644 less the umask, as a plain create would: under
// umask 077 a trace (argument values) is the user's alone. Before, both
// writers chmod'ed 0644 whatever the umask.
func TestOutputsKeepUmask(t *testing.T) {
	for _, c := range []struct {
		umask int
		want  os.FileMode
	}{{0o077, 0o600}, {0o027, 0o640}, {0o022, 0o644}} {
		old := unix.Umask(c.umask)
		dir := t.TempDir()
		a, err := createAtomic(filepath.Join(dir, "trace.json"))
		if err == nil {
			_, err = a.Write([]byte("{}"))
		}
		if err == nil {
			err = a.commit()
		}
		if err == nil {
			err = probelist.WriteFileAtomic(filepath.Join(dir, "profile.pb.gz"), []byte("x"), 0o644)
		}
		unix.Umask(old)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"trace.json", "profile.pb.gz"} {
			st, err := os.Stat(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if got := st.Mode().Perm(); got != c.want {
				t.Errorf("umask %03o: %s is %03o, want %03o", c.umask, name, got, c.want)
			}
		}
	}
}

// TestOutputsLinkSwap: with fs.protected_symlinks off, another user swaps a
// directory of theirs in /tmp with their link to a directory of root's
// while root writes a trace (-o) and a profile or probe list (the atomic
// writers) into their directory. Each write must land in their directory
// or be refused at the planted link (ErrPlantedLink); nothing may appear
// in root's directory. Before (D99), the temporary was made and renamed
// by path: both steps followed whichever the name was at the moment (and a
// link that stayed planted was always followed). Bounded by writes.
func TestOutputsLinkSwap(t *testing.T) {
	other := testutil.OtherUser(t)
	s := testutil.StartLinkSwap(t, other, 1<<40)
	out := filepath.Join(s.Path, "out.json")
	writers := map[string]func() error{
		"trace": func() error {
			a, err := createAtomic(out)
			if err != nil {
				return err
			}
			defer a.abort()
			if _, err := a.Write([]byte("{}")); err != nil {
				return err
			}
			return a.commit()
		},
		"atomic file": func() error { return probelist.WriteFileAtomic(out, []byte("x"), 0o644) },
	}
	for name, write := range writers {
		var done, refused int
		for i := 0; i < 300; i++ {
			err := write()
			switch {
			case err == nil:
				done++
			case errors.Is(err, procfs.ErrPlantedLink):
				refused++
			default:
				t.Fatalf("%s, write %d: %v; want a write or ErrPlantedLink", name, i, err)
			}
			if ents, _ := os.ReadDir(s.Victim); len(ents) != 0 {
				t.Fatalf("%s, write %d: %s appeared in root's directory through the swapped-in link", name, i, ents[0].Name())
			}
		}
		t.Logf("%s: %d written, %d refused at the link", name, done, refused)
	}
	s.Check(t)
}
