package hotpatch

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// edgeprobeFiles lists the entries of dir whose names mention edgeprobe.
func edgeprobeFiles(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if strings.Contains(e.Name(), "edgeprobe") {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestOtherUser: a second, unprivileged local user cannot block, redirect or
// read a hotpatch run on a process it does not own. Issue 11: lock files in
// world-writable /run/lock let any user hold the lock (forever, with
// --wait), lock the owner out by failing an attempt, make root create a file
// through a planted symlink, and 218 files were left behind. The lock is the
// ptrace attach now: no file is involved, so a planted file changes nothing
// and nothing is created.
func TestOtherUser(t *testing.T) {
	testutil.RequirePtrace(t)
	other := testutil.OtherUser(t)
	s := startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "flip", false)
	pid := fmt.Sprint(s.Pid)

	// The other user's copy of hotpatch (the test's build dir is private).
	dir, err := os.MkdirTemp("", "edgeprobe-otheruser-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "hotpatch")
	src, err := os.Open(testutil.Command(t, "hotpatch"))
	if err != nil {
		t.Fatal(err)
	}
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	src.Close()
	dst.Close()
	asOther := func(args ...string) (int, string) {
		cmd := other.Command(bin, args...)
		cmd.Env = []string{"HOME=/nonexistent", "EDGEPROBE_CACHE=off", "PATH=/usr/bin:/bin"}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := testutil.RunBound(cmd)
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), stderr.String()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0, stderr.String()
	}

	// It can neither patch nor read the process: one line, a failure.
	for _, args := range [][]string{{"--pid", pid, "--enable", "*"}, {"--pid", pid, "--wait", "--disable", "*"}, {"list", "--pid", pid}, {"repair", "--pid", pid}} {
		code, stderr := asOther(args...)
		if code == 0 || strings.Count(stderr, "\n") != 1 {
			t.Errorf("other user, hotpatch %s: exit %d, stderr %q; want a one-line failure", strings.Join(args, " "), code, stderr)
		}
	}

	// Its plants where the old lock files lived: a symlink named like one
	// (root would once have created its target) and a file it holds.
	victim := filepath.Join(dir, "created-through-symlink")
	var planted []string
	for _, d := range []string{"/run/lock", os.TempDir()} {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			continue
		}
		link := filepath.Join(d, fmt.Sprintf("edgeprobe-%d-planted.lock", s.Pid))
		cmd := other.Command("ln", "-s", victim, link)
		if out, err := cmd.CombinedOutput(); err == nil {
			planted = append(planted, link)
		} else {
			t.Logf("cannot plant in %s: %v %s", d, err, out)
		}
	}
	t.Cleanup(func() {
		for _, p := range planted {
			os.Remove(p)
		}
	})
	// /run/lock is the place issue 11's lock files were left in. In the
	// temporary directory other packages' tests (run at the same time)
	// make edgeprobe-* directories of their own: there, only names that
	// carry the target's pid, as a lock or temporary file of this run's
	// would (the planted links do), are compared.
	forTarget := func(names []string) []string {
		var out []string
		for _, n := range names {
			if strings.Contains(n, fmt.Sprint(s.Pid)) {
				out = append(out, n)
			}
		}
		return out
	}
	snapshot := func(d string) []string {
		if d == "/run/lock" {
			return edgeprobeFiles(d)
		}
		return forTarget(edgeprobeFiles(d))
	}
	before := map[string][]string{}
	for _, d := range []string{"/run/lock", os.TempDir()} {
		before[d] = snapshot(d)
	}

	// The owner (root here) is neither blocked nor redirected.
	s.hotpatch(t, "--enable", "work")
	s.expectMoving(t, "work on despite the other user", true, true)
	s.hotpatch(t, "--wait", "--disable", "work")
	if _, err := os.Lstat(victim); err == nil {
		t.Errorf("hotpatch created %s through a planted symlink", victim)
	}
	for d, names := range before {
		if after := snapshot(d); strings.Join(after, ",") != strings.Join(names, ",") {
			t.Errorf("%s: edgeprobe files %v before, %v after: hotpatch left something behind", d, names, after)
		}
	}
	s.finish(t)
}
