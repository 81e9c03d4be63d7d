//go:build reviewbugs

package capture

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// Review (hostile): a program run under a file-size limit (`ulimit -f`, as
// batch systems and judges set it). The region is a memfd sized with
// ftruncate, which RLIMIT_FSIZE governs: sizing it past the limit raises
// SIGXFSZ, whose default action kills the program before main. The runtime
// must never kill its host: the program must run as it would without the
// preload, and (as under RLIMIT_AS) record in a region that fits.
func TestReviewFileSizeLimit(t *testing.T) {
	lib := testutil.Runtime(t, "gcc")
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}, Opt: "-O0"})
	for _, blocks := range []string{"1000000", "100000"} { // dash counts 512-byte blocks: 512 MB, 51 MB (the runtime of 96b2be5 ran under both)
		t.Run(blocks+"blocks", func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "run.ep")
			cmd := exec.Command("/bin/sh", "-c", `ulimit -f "$1" && shift && exec "$@"`, "sh", blocks, fx.Path, "12")
			cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib, "EDGEPROBE_OUTPUT="+out)
			b, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("under ulimit -f %s the preloaded program failed: %v: %s", blocks, err, b)
			}
			r := testutil.Run(t, "hotpatch", "stats", "--input", out, "--json", "--sort", "name")
			if r.Code != 0 {
				t.Fatal(r.Stderr)
			}
			var st struct {
				Functions []struct {
					Name    string  `json:"name"`
					Entries float64 `json:"entries"`
				} `json:"functions"`
			}
			if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
				t.Fatal(err)
			}
			for _, f := range st.Functions {
				if f.Name == "fib" && f.Entries == 465 {
					return
				}
			}
			t.Errorf("no fib with 465 calls in %s", strings.TrimSpace(r.Stdout))
		})
	}
}
