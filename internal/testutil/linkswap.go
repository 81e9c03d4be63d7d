package testutil

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// LinkSwap is the scene of a link-swap race (review8, D99): in a sticky
// directory everyone may write (like /tmp), the other user's directory
// Sticky/d, which root's tools may use, is exchanged without pause with the
// other user's symbolic link to Victim, a directory of root's only, so
// that a path through Sticky/d names a file of either at any moment.
type LinkSwap struct {
	Sticky string // the sticky, world-writable directory
	Path   string // Sticky/d: the name being swapped
	Victim string // root's directory the link names
	// Real reaches the other user's directory wherever it is at the
	// moment (our /proc/self/fd link to it): the test's way to put files
	// there during the race.
	Real string

	stderr *SyncBuffer
}

// ProtectedSymlinksOff turns the kernel's fs.protected_symlinks off for
// the test (it is off in many containers and some distributions: the case
// our own checks must hold in) and restores it at Cleanup. Needs root.
// Test binaries of several packages run at once: each holds an exclusive
// flock of a root-only lock file from before it reads the setting until
// it has restored it, so that none saves another's 0 and "restores" the
// machine to it.
func ProtectedSymlinksOff(t testing.TB) {
	t.Helper()
	RequireRoot(t, "sets fs.protected_symlinks")
	const knob = "/proc/sys/fs/protected_symlinks"
	lock, err := unix.Open("/run/edgeprobe-test-protected-symlinks.lock", unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		Unavailable(t, "the lock of %s: %v", knob, err)
	}
	if err := unix.Flock(lock, unix.LOCK_EX); err != nil {
		unix.Close(lock)
		t.Fatalf("the lock of %s: %v", knob, err)
	}
	t.Cleanup(func() { unix.Close(lock) }) // after the restore below (Cleanup runs last-in first-out)
	old, err := os.ReadFile(knob)
	if err != nil {
		Unavailable(t, "%s: %v", knob, err)
	}
	if err := os.WriteFile(knob, []byte("0\n"), 0); err != nil {
		Unavailable(t, "%s: %v", knob, err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(knob, old, 0); err != nil {
			t.Errorf("restoring %s to %q: %v", knob, strings.TrimSpace(string(old)), err)
		}
	})
}

// StartLinkSwap sets the scene up with fs.protected_symlinks off and starts
// the other user's swapper (swaplink.c), which runs until the test ends
// (at most swaps exchanges). Root's files go in Real and Victim.
func StartLinkSwap(t testing.TB, other Other, swaps int) *LinkSwap {
	t.Helper()
	ProtectedSymlinksOff(t)
	built := Build(t, Spec{Compiler: "gcc", Opt: "-O2", NoInstr: true, Sources: []string{"swaplink.c"}}).Path
	sticky, err := os.MkdirTemp("", "edgeprobe-swap-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sticky) })
	if err := os.Chmod(sticky, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	victim := t.TempDir() // root's, private
	s := &LinkSwap{Sticky: sticky, Path: filepath.Join(sticky, "d"), Victim: victim}
	alt := filepath.Join(sticky, "x")
	if err := os.Mkdir(s.Path, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, alt); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{s.Path, alt} {
		if err := os.Lchown(p, int(other.UID), int(other.GID)); err != nil {
			t.Fatal(err)
		}
	}
	fd, err := unix.Open(s.Path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	s.Real = "/proc/self/fd/" + strconv.Itoa(fd)
	bin := CopyInto(t, built, sticky)
	cmd := other.Command(bin, s.Path, alt, strconv.Itoa(swaps))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &SyncBuffer{}
	s.stderr = stderr
	cmd.Stderr = stderr
	if err := StartBound(cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("swaplink as %s: %q, %v: %s", other.Name, line, err, stderr.String())
	}
	return s
}

// Check fails the test if the swapper stopped on an error: a race the test
// believes it ran would not have run.
func (s *LinkSwap) Check(t testing.TB) {
	t.Helper()
	if e := s.stderr.String(); e != "" {
		t.Fatalf("the swapper failed, no race ran: %s", e)
	}
}
