package hotpatch

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestSetIDTarget: a set-user-id-root copy of an instrumented program run
// by another user, and hotpatch run by that same user. The process is
// theirs by its real uid but not dumpable: only CAP_SYS_PTRACE may trace
// it. Every command must refuse in one line that says why, having
// written nothing; before, the line said only "needs root or
// CAP_SYS_PTRACE", which to its owner reads as a wrong message.
func TestSetIDTarget(t *testing.T) {
	testutil.RequirePtrace(t)
	other := testutil.OtherUser(t)
	built := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"mt.c"}}).Path
	dir, err := os.MkdirTemp("", "edgeprobe-setid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	bin := testutil.CopyInto(t, built, dir)
	if err := os.Chmod(bin, 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	hp := testutil.CopyInto(t, testutil.Command(t, "hotpatch"), dir)
	stop := filepath.Join(dir, "stop")
	cmd := other.Command(bin, stop)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := testutil.StartBound(cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready ") {
		t.Fatalf("set-id mt.c as %s: %q, %v", other.Name, line, err)
	}
	pid := fmt.Sprint(cmd.Process.Pid)
	if st, err := procfs.ReadStatus(cmd.Process.Pid, 0); err != nil || !strings.HasPrefix(st["Uid"], fmt.Sprintf("%d\t0\t", other.UID)) {
		testutil.Unavailable(t, "the set-id copy did not run set-id (Uid %q, %v): %s is mounted nosuid?", st["Uid"], err, dir)
	}
	for _, args := range [][]string{{"--pid", pid, "--enable", "work"}, {"--pid", pid, "--protocol", "int3", "--enable", "work"}, {"repair", "--pid", pid}} {
		c := other.Command(hp, args...)
		c.Env = []string{"HOME=" + dir, "PATH=/usr/bin:/bin"}
		var stdout, stderr strings.Builder
		c.Stdout, c.Stderr = &stdout, &stderr
		err := testutil.RunBound(c)
		if err == nil || stdout.String() != "" || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), "not dumpable") {
			t.Errorf("hotpatch %s as %s on their set-id process: %v, stdout %q, stderr %q; want a failure, one line saying it is not dumpable",
				strings.Join(args, " "), other.Name, err, stdout.String(), stderr.String())
		}
	}
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}
