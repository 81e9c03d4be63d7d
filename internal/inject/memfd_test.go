package inject_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestLoadMemfdReplaced: a target run by another user swaps the load's
// memfd for a file it can only name (an O_PATH descriptor of a root-only
// file) the moment memfd_create has made it. Root's hotpatch must not write
// that file: before D82 it reopened /proc/PID/fd/N with O_TRUNC as root and
// wrote the runtime into whatever the descriptor named by then (the file was
// overwritten in about four loads of five). Now it writes only through the
// program's own open file, checked to be the new memfd: a load whose memfd
// was replaced fails with one line and the file keeps its bytes. A load
// where the program swapped too late (after the write) fails in the
// program's dlopen, which opens the file as the program's user; the file is
// unchanged either way; a swap after the program's dlopen has mapped the memfd
// is harmless (the load goes on). Ten loads at most, until three loads were
// refused for a swap.
func TestLoadMemfdReplaced(t *testing.T) {
	testutil.RequirePtrace(t)
	other := testutil.OtherUser(t)
	useRuntime(t)
	built := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"fdswap.c"}}).Path
	// The other user's copy of the program, beside root's file, in a
	// directory it can search (the test's own are private).
	dir, err := os.MkdirTemp("", "edgeprobe-fdswap-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := testutil.CopyInto(t, built, dir)
	victim := filepath.Join(dir, "root-only")
	const precious = "root's own bytes\n"
	if err := os.WriteFile(victim, []byte(precious), 0o600); err != nil {
		t.Fatal(err)
	}
	swaps := 0
	for load := 0; load < 10 && swaps < 3; load++ {
		pid, rest := startAsOther(t, other, bin, victim)
		r := testutil.Run(t, "hotpatch", "--pid", fmt.Sprint(pid), "--enable", "work")
		out := rest()
		if b, err := os.ReadFile(victim); err != nil || string(b) != precious {
			t.Fatalf("load %d: root's hotpatch wrote into a file the target's user only named (%q, %v); exit %d, stderr %q, target said %q",
				load, truncate(b), err, r.Code, r.Stderr, out)
		}
		if !strings.Contains(out, "swapped ") {
			// The program lost the race: an ordinary load.
			if r.Code != 0 || !loadedNote.MatchString(r.Stderr) {
				t.Fatalf("load %d without a swap: exit %d, stderr %q", load, r.Code, r.Stderr)
			}
			continue
		}
		if r.Code == 0 && loadedNote.MatchString(r.Stderr) {
			// Swapped after the loader's dlopen had mapped the memfd (its
			// close(N) then closed the program's file): a load as usual.
			continue
		}
		swaps++
		if r.Code != 1 || strings.Count(r.Stderr, "\n") != 1 {
			t.Fatalf("load %d, memfd replaced: want one line and exit 1, got exit %d: %q", load, r.Code, r.Stderr)
		}
		t.Logf("load %d: %s", load, strings.TrimSpace(r.Stderr))
	}
	if swaps == 0 {
		t.Fatal("the program never replaced the memfd before the load used it, in 10 loads: nothing was shown")
	}
}

// startAsOther starts fixture bin with args as the other user and waits for
// its ready line; it returns the pid and a function that kills the process
// and returns the rest of its output.
func startAsOther(t *testing.T, other testutil.Other, bin string, args ...string) (int, func() string) {
	t.Helper()
	cmd := other.Command(bin, args...)
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = w
	err = testutil.StartCmd(cmd)
	w.Close()
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	br := bufio.NewReader(r)
	done := false
	rest := func() string {
		if done {
			return ""
		}
		done = true
		cmd.Process.Kill()
		_ = cmd.Wait()
		b, _ := br.ReadString(0)
		r.Close()
		return b
	}
	t.Cleanup(func() { rest() })
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready ") {
		t.Fatalf("%s: want a ready line, got %q, %v", bin, line, err)
	}
	return cmd.Process.Pid, rest
}

func truncate(b []byte) string {
	if len(b) > 32 {
		return string(b[:32]) + "..."
	}
	return string(b)
}
