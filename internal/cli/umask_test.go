package cli

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
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
