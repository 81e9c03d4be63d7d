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

// A program run under a file-size limit (`ulimit -f`, as batch systems and
// judges set it). The region is a memfd sized with
// ftruncate, which RLIMIT_FSIZE governs: sizing it past the limit raises
// SIGXFSZ, whose default action kills the program before main. The runtime
// must never kill its host: the program must run as it would without the
// preload, and (as under RLIMIT_AS) record in a region that fits.
func TestFileSizeLimit(t *testing.T) {
	lib := testutil.Runtime(t, "gcc")
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}, Opt: "-O0"})
	for _, blocks := range []string{"1000000", "100000"} { // dash counts 512-byte blocks: 512 MB, 51 MB (the runtime of 96b2be5 ran under both)
		t.Run(blocks+"blocks", func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "run.ep")
			cmd := exec.Command("/bin/sh", "-c", `ulimit -f "$1" && shift && exec "$@"`, "sh", blocks, fx.Path, "12")
			cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib, "EDGEPROBE_OUTPUT="+out)
			b, err := testutil.CombinedOutputBound(cmd)
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
	// A limit below even the smallest region (100 blocks: 51,200 bytes): the
	// program runs as without the preload, with one line saying why it is
	// not recorded, and no output file.
	t.Run("100blocks", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "run.ep")
		cmd := exec.Command("/bin/sh", "-c", `ulimit -f "$1" && shift && exec "$@"`, "sh", "100", fx.Path, "12")
		cmd.Env = append(os.Environ(), "EDGEPROBE_OUTPUT="+out)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := testutil.RunBound(cmd); err != nil {
			t.Fatalf("without the preload under ulimit -f 100 the program failed: %v: %s", err, stderr.String())
		}
		want := stdout.String()
		stdout.Reset()
		stderr.Reset()
		cmd = exec.Command("/bin/sh", "-c", `ulimit -f "$1" && shift && exec "$@"`, "sh", "100", fx.Path, "12")
		cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib, "EDGEPROBE_OUTPUT="+out)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := testutil.RunBound(cmd); err != nil {
			t.Fatalf("under ulimit -f 100 the preloaded program failed: %v: %s", err, stderr.String())
		}
		if stdout.String() != want {
			t.Errorf("the preloaded program printed %q, without the preload %q", stdout.String(), want)
		}
		msg := strings.TrimSpace(stderr.String())
		if strings.Count(msg, "\n") != 0 || !strings.Contains(msg, "file-size limit (ulimit -f)") {
			t.Errorf("want one line naming the file-size limit, got %q", msg)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("an output file exists although nothing was recorded (stat: %v)", err)
		}
	})
}

// The EDGEPROBE_OUTPUT writer at exit under a file-size limit the program set
// itself (below the output's size): one line, no output and no temporary
// file left, and the program's own exit status (not SIGXFSZ).
func TestFileSizeLimitAtExit(t *testing.T) {
	lib := testutil.Runtime(t, "gcc")
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"fsizeexit.c"}, Opt: "-O0"})
	dir := t.TempDir()
	out := filepath.Join(dir, "run.ep")
	cmd := exec.Command(fx.Path, "4096")
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib, "EDGEPROBE_OUTPUT="+out)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := testutil.RunBound(cmd)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
		t.Fatalf("want the program's own exit status 3, got %v (stderr %q)", err, stderr.String())
	}
	if stdout.String() != "9900\n" {
		t.Errorf("program printed %q, want 9900", stdout.String())
	}
	msg := strings.TrimSpace(stderr.String())
	if strings.Count(msg, "\n") != 0 || !strings.Contains(msg, "file-size limit (ulimit -f)") {
		t.Errorf("want one line naming the file-size limit, got %q", msg)
	}
	left, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("files left behind: %v", left)
	}
}
