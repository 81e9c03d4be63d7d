package testutil

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const envOrphanHelper = "EDGEPROBE_TEST_ORPHAN_HELPER"

// TestFixturesDieWithTest: a test binary killed outright (its timeout, a
// developer's kill -9, the OOM killer) runs no cleanup. The fixtures it
// started must not live on with init as their parent (review6's mt ran at
// 95% CPU for an hour): a child test binary starts mt.c three ways (Start;
// StartBound, as the tests that exec a target themselves now do; RunBound
// from a goroutine, as a fixture run to its end) and is SIGKILLed; each
// fixture must be gone. Waited for with a pidfd (readable when the process
// exits), bounded, not slept on.
func TestFixturesDieWithTest(t *testing.T) {
	if os.Getenv(envOrphanHelper) != "" {
		orphanHelper(t)
		return
	}
	OtherUser(t) // the helper starts one of the fixtures as the other user
	bin := Build(t, Spec{Sources: []string{"mt.c", "hooks.c"}}).Path
	cmd := exec.Command(os.Args[0], "-test.run=^TestFixturesDieWithTest$", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), envOrphanHelper+"="+bin)
	var stderr SyncBuffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := StartBound(cmd); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "pids ") {
		t.Fatalf("helper: want its fixtures' pids, got %q, %v (stderr %q)", line, err, stderr.String())
	}
	var fds []int
	names := strings.Fields(strings.TrimPrefix(line, "pids "))
	for _, f := range names {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("helper said %q", line)
		}
		// Opened while the fixture is the helper's live child: the pidfd
		// names that process, not a later holder of the number.
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			t.Fatalf("pidfd_open(%d): %v", pid, err)
		}
		defer unix.Close(fd)
		fds = append(fds, fd)
	}
	if len(fds) != 3 {
		t.Fatalf("helper said %q, want three pids", line)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killed = true
	// A bound, not a synchronisation: the parent-death signal is sent as
	// the helper exits; a fixture still there after a minute is orphaned.
	deadline := time.Now().Add(time.Minute)
	for i, fd := range fds {
		for {
			ms := int(time.Until(deadline) / time.Millisecond)
			if ms < 0 {
				ms = 0
			}
			n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, ms)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				pid, _ := strconv.Atoi(names[i])
				unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
				t.Errorf("fixture %d (started by the helper's %s) still runs a minute after its test binary was killed (killed now)", pid, []string{"Start", "StartBound", "StartBound as another user"}[i])
			}
			break
		}
	}
}

// orphanHelper is the child test binary's part: three fixtures, their pids
// on stdout, then it waits to be killed.
func orphanHelper(t *testing.T) {
	bin := os.Getenv(envOrphanHelper)
	p := Start(t, nil, bin)
	bound := exec.Command(bin, filepath.Join(t.TempDir(), "stop"))
	if err := StartBound(bound); err != nil {
		t.Fatal(err)
	}
	// The other user's: a change of credentials clears a parent-death
	// signal set before it (Go sets it after).
	dir, err := os.MkdirTemp("", "edgeprobe-orphan-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	other := OtherUser(t).Command(CopyInto(t, bin, dir), filepath.Join(dir, "stop"))
	if err := StartBound(other); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("pids %d %d %d\n", p.Pid, bound.Process.Pid, other.Process.Pid)
	select {}
}
