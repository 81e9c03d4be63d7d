package hotpatch

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestProbeListNotAFile (D88): a --probes path that names something other
// than a bounded regular file (it may be another user's: a list written
// beside their program) is refused in one line, at once, without reading
// it. Before, root's hotpatch read /dev/zero without end (3 GB in 22 s by
// hand, holding the target's tracer meanwhile), waited forever in the open
// of a FIFO nobody writes, and read a sparse file of any declared size
// whole before parsing it.
func TestProbeListNotAFile(t *testing.T) {
	testutil.RequirePtrace(t)
	t.Setenv(EnvRuntime, testutil.Runtime(t, "gcc"))
	bin := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"mt.c"}}).Path
	p := testutil.Start(t, nil, bin)
	pid := fmt.Sprint(p.Pid)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	sparse := filepath.Join(dir, "sparse.json")
	if err := os.WriteFile(sparse, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(sparse, probelist.MaxFileBytes+1); err != nil {
		t.Fatal(err)
	}
	hp := testutil.Command(t, "hotpatch")
	for _, c := range []struct{ path, says string }{
		{"/dev/zero", "not a regular file (a character device)"},
		{fifo, "not a regular file (a FIFO)"},
		{sparse, "more than any probe list"},
	} {
		// A bound, not a synchronisation: a refusal reads nothing and
		// takes milliseconds; a run still going then is reading or waiting.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		cmd := exec.CommandContext(ctx, hp, "--pid", pid, "--probes", c.path, "--enable", "work")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := testutil.RunBound(cmd)
		held := ctx.Err() != nil
		cancel()
		var rss int64
		if cmd.ProcessState != nil {
			rss = cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss
		}
		if held {
			t.Errorf("--probes %s: still running after 5 s (killed; it grew to %d MiB)", c.path, rss>>10)
			continue
		}
		code := -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != 1 || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), c.says) {
			t.Errorf("--probes %s: exit %d (%v), stderr %q; want exit 1 and one line saying %q", c.path, code, err, stderr.String(), c.says)
		}
		if rss > 200<<10 {
			t.Errorf("--probes %s: hotpatch grew to %d MiB", c.path, rss>>10)
		}
	}
	// What was refused is the file, not the process.
	hotpatchOK(t, "--pid", pid, "--enable", "work")
	p.Finish()
}
