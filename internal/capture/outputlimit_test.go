package capture

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestTraceOutputPastFileSizeLimit: a trace whose output reaches the
// file-size limit (ulimit -f; a full disk fails the same write with
// ENOSPC) ends at its first failed write (the text view went on for the
// whole --duration), with one line naming the file and exit 1, leaves no
// file (not even its temporary), and leaves the program as it found it:
// rings off, every probe off, results right. The same for the text view
// on stdout.
func TestTraceOutputPastFileSizeLimit(t *testing.T) {
	p := startCold(t)
	region, err := shm.OpenPID(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	hp := testutil.Command(t, "hotpatch")
	for _, format := range []string{"perfetto", "chrome-json", "text"} {
		t.Run(format, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "t.out")
			// 16 blocks of 512 bytes (dash counts ulimit -f in 512-byte blocks; bash
			// in KiB): either is far below what 30 s of work and leaf make.
			script := `ulimit -f 16 && exec "$@"`
			args := []string{"-c", script, "sh", hp, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "work", "--enable", "leaf",
				"--duration", "10m", "--format", format}
			if format == "chrome-json" {
				// held in memory and written at the end: stop at 20,000 calls
				args = append(args, "--max-calls", "20000")
			}
			if format != "text" {
				args = append(args, "-o", out)
			} else {
				args = append(args, "-o", out+".txt")
			}
			cmd := exec.Command("sh", args...)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := testutil.StartBound(cmd); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			var err error
			select {
			case err = <-done:
			case <-time.After(2 * time.Minute):
				// A watchdog, not a measure: the trace asks for 10 minutes and
				// must end at its first failed write.
				cmd.Process.Kill()
				<-done
				t.Fatalf("the trace was still running 2 minutes after its output hit the file-size limit (stderr %q)", stderr.String())
			}
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 1 || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), "file too large") {
				t.Fatalf("trace past the file-size limit: %v, stderr %q; want exit 1 and one line saying the file is too large", err, stderr.String())
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("left in the output's directory: %v", ents)
			}
			if ctl := region.Control(); ctl&(shm.CtlTrace|shm.CtlArgs|shm.CtlQuota|shm.CtlFilter) != 0 {
				t.Errorf("control %#x after the failed trace", ctl)
			}
			allOff(t, p)
		})
	}
	if out, _ := p.Finish(); !strings.Contains(out, "wrong=0") {
		t.Fatalf("program output %q", out)
	}
}
