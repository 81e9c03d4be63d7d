package procfs_test

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestLinkSwapRace: with fs.protected_symlinks off, another user swaps a
// directory of theirs in /tmp with their link to a directory of root's
// while root opens a file through it: OpenRegular (the runtime file, a
// coldpatch input, a region file) and OpenOwned (`hotpatch --commands
// FILE`). Each open must give the file in the other user's directory or
// refuse the planted link; it must never give root's file. Before (D99)
// the links were checked by one walk and the path opened by another, so a
// swap in between was followed. The loop is bounded by opens, not time.
func TestLinkSwapRace(t *testing.T) {
	other := testutil.OtherUser(t)
	s := testutil.StartLinkSwap(t, other, 1<<40)
	if err := os.WriteFile(filepath.Join(s.Real, "f"), []byte("theirs"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.Victim, "f"), []byte("root's secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(s.Path, "f")
	for _, c := range []struct {
		name string
		open func(string) (*os.File, error)
	}{{"OpenRegular", procfs.OpenRegular}, {"OpenOwned", procfs.OpenOwned}} {
		t.Run(c.name, func(t *testing.T) {
			var ok, refused int
			for i := 0; i < 2000; i++ {
				f, err := c.open(path)
				if err != nil {
					if !errors.Is(err, procfs.ErrPlantedLink) {
						t.Fatalf("%s(%s), open %d: %v; want the file or ErrPlantedLink", c.name, path, i, err)
					}
					refused++
					continue
				}
				b, err := io.ReadAll(f)
				f.Close()
				if err != nil {
					t.Fatal(err)
				}
				if string(b) != "theirs" {
					t.Fatalf("%s(%s), open %d: read %q: the swapped-in link to root's directory was followed", c.name, path, i, b)
				}
				ok++
			}
			t.Logf("%d opens of the other user's file, %d refused at the link", ok, refused)
		})
	}
	s.Check(t)
}
