package probelist

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestOpenFilePlantedLink: `--probes /tmp/NAME` where another user put a
// link at NAME in the sticky, world-writable directory (to a list of
// root's, or to a device): it is not followed (procfs.ErrPlantedLink, the
// rule of fs.protected_symlinks, often off), and nothing it names is
// opened. Root's own link there, and the file itself, are read. Before,
// OpenFile opened the path as given, following the link.
func TestOpenFilePlantedLink(t *testing.T) {
	testutil.RequireRoot(t, "a link owned by another uid (Lchown)")
	base := t.TempDir()
	sticky := filepath.Join(base, "tmp")
	if err := os.Mkdir(sticky, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sticky, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	list := filepath.Join(base, "roots.json")
	if err := os.WriteFile(list, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := func(name string, uid int, to string) string {
		p := filepath.Join(sticky, name)
		if err := os.Symlink(to, p); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, p := range []string{link("theirs.json", 65534, list), link("dev.json", 65534, "/dev/zero")} {
		f, _, err := OpenFile(p)
		if err == nil {
			f.Close()
		}
		if !errors.Is(err, procfs.ErrPlantedLink) {
			t.Errorf("%s (another uid's link): %v; want ErrPlantedLink", p, err)
		}
	}
	for _, p := range []string{link("own.json", 0, list), list} {
		f, r, err := OpenFile(p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		b := make([]byte, 8)
		n, _ := r.Read(b)
		f.Close()
		if string(b[:n]) != "{}" {
			t.Errorf("%s: read %q", p, b[:n])
		}
	}
}
