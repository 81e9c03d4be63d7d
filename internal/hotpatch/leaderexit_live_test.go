package hotpatch

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestLeaderExited: a process whose main thread called pthread_exit runs
// on in its other threads, but ptrace cannot attach an exited thread and
// its /proc/PID/mem has no memory behind it: hotpatch cannot work on it.
// Each command must say that in one line and exit 1, not claim the
// process is gone (exit 4: "open /proc/PID/mem: no such process") or that
// root lacks a privilege ("needs root or CAP_SYS_PTRACE"), as it did; and
// the process runs on untouched.
func TestLeaderExited(t *testing.T) {
	testutil.RequirePtrace(t)
	hooks := hooksLib(t)
	fix := testutil.Build(t, testutil.Spec{Sources: []string{"leaderexit.c"}})
	dir := filepath.Dir(fix.Path)
	r := command(t, "coldpatch", fix.Path)
	if r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	list := filepath.Join(dir, "leaderexit.json")
	if err := os.WriteFile(list, []byte(r.Stdout), 0o644); err != nil {
		t.Fatal(err)
	}
	p := testutil.Start(t, []string{"LD_PRELOAD=" + hooks}, fix.Path)
	for st, err := procfs.ReadStat(p.Pid, 0); err != nil || st.State != 'Z'; st, err = procfs.ReadStat(p.Pid, 0) {
		if err != nil {
			t.Fatal(err)
		}
		p.AwaitProgress(p.Symbol(fix.Path, "progress"), 1) // the main thread is on its way out
	}
	pid := fmt.Sprint(p.Pid)
	for _, args := range [][]string{
		{"--pid", pid, "--probes", list, "--enable", "work"},
		{"--pid", pid, "--probes", list, "--disable", "work"},
		{"--pid", pid, "--enable", "work"},
		{"session", "--pid", pid, "--probes", list},
		{"repair", "--pid", pid},
		{"list", "--pid", pid},
		{"stats", "--pid", pid},
	} {
		r := command(t, "hotpatch", args...)
		if r.Code != 1 || strings.Count(r.Stderr, "\n") != 1 || !strings.Contains(r.Stderr, "main thread has exited") {
			t.Errorf("hotpatch %s: exit %d, stderr %q; want 1 and one line saying its main thread has exited", strings.Join(args, " "), r.Code, r.Stderr)
		}
	}
	if out, _ := p.Finish(); !strings.HasPrefix(out, "done 1") {
		t.Fatalf("leaderexit: %q", out)
	}
}
