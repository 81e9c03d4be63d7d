package capture

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestSecondCaptureRefused (review, hostile): while a trace with a quota
// (--rate) and a filter (--max-depth) runs, a second capture of the same
// process (a profile, which would rewrite the quota under it) is refused
// with a one-line error and changes nothing; the first, interrupted with
// SIGINT, still ends cleanly and turns every bit it set off again.
func TestSecondCaptureRefused(t *testing.T) {
	p := startCold(t)
	region, err := shm.OpenPID(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	dir := t.TempDir()
	first := exec.Command(testutil.Command(t, "hotpatch"), "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "work", "--enable", "leaf",
		"--rate", "50", "--max-depth", "1", "--duration", "5m", "-o", filepath.Join(dir, "a.json"))
	var firstErr strings.Builder
	first.Stderr = &firstErr
	if err := testutil.StartBound(first); err != nil {
		t.Fatal(err)
	}
	const bits = shm.CtlTrace | shm.CtlQuota | shm.CtlFilter
	waitFor(t, "the first capture to start", func() bool { return region.Control()&bits == bits })
	k := region.Header().QuotaK
	r := testutil.Run(t, "hotpatch", "profile", "--pid", fmt.Sprint(p.Pid), "--samples", "7", "--duration", "1s", "-o", filepath.Join(dir, "b.pprof"))
	if r.Code == 0 || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 || !strings.Contains(r.Stderr, "hotpatch") {
		t.Errorf("second capture: exit %d, stderr %q; want a one-line refusal", r.Code, r.Stderr)
	}
	t.Logf("second capture: %s", strings.TrimSpace(r.Stderr))
	if h := region.Header(); h.QuotaK != k || h.Control&bits != bits {
		t.Errorf("after the refused capture: quota %d (was %d), control %#x", h.QuotaK, k, h.Control)
	}
	first.Process.Signal(syscall.SIGINT)
	if err := first.Wait(); err != nil {
		t.Fatalf("first capture after SIGINT: %v: %s", err, firstErr.String())
	}
	if ctl := region.Control(); ctl&(bits|shm.CtlArgs) != 0 {
		t.Errorf("control %#x after the first capture ended", ctl)
	}
	allOff(t, p)
	if out, _ := p.Finish(); !strings.Contains(out, "wrong=0") {
		t.Fatalf("program output %q", out)
	}
}
