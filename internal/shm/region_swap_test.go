package shm

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestRegionFDSwapped (R6-1, D86): a target run by another user keeps
// putting a file under its own write lease and a FIFO on its region's
// descriptor number (leaseswap.c) while root's `hotpatch stats` reads its
// region. Before D86 OpenPID read the number's link and then opened
// /proc/PID/fd/N as root: whatever the number held by then was opened with
// root's credentials (a leased file's open waits for the lease holder, up
// to fs.lease-break-time, 45 s; the FIFO was opened). Now the program's own
// open file is taken (pidfd_getfd) and checked: nothing of the program's is
// opened, and every stats run ends within the bound with the counts.
func TestRegionFDSwapped(t *testing.T) {
	testutil.RequirePtrace(t)
	other := testutil.OtherUser(t)
	built := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"leaseswap.c"}}).Path
	// The other user's copies of the program and the runtime in a
	// directory it can search (the test's own are private), and a
	// directory of its own for the leased file and the FIFO.
	dir, err := os.MkdirTemp("", "edgeprobe-leaseswap-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	own := filepath.Join(dir, "own")
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(own, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(own, int(other.UID), int(other.GID)); err != nil {
		t.Fatal(err)
	}
	bin := copyInto(t, built, dir)
	lib := copyInto(t, buildRuntime(t, "gcc"), dir)

	cmd := other.Command(bin, own)
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib)
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	var out testutil.SyncBuffer
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = pw
	cmd.Stderr = &out
	err = testutil.StartCmd(cmd)
	pw.Close()
	if err != nil {
		pr.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	br := bufio.NewReader(pr)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready ") {
		t.Fatalf("leaseswap: want a ready line, got %q, %v (stderr %q)", line, err, out.String())
	}
	// What the program says after its ready line: opens and lease breaks.
	said := make(chan string, 64)
	go func() {
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				close(said)
				return
			}
			said <- strings.TrimSpace(l)
		}
	}()

	hp := testutil.Command(t, "hotpatch")
	// A bound, not a synchronisation: a run that has not ended by then is
	// held by the program (the lease break time is 45 s).
	const bound = 15 * time.Second
	const runs = 40
	for i := 0; i < runs; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		c := exec.CommandContext(ctx, hp, "stats", "--pid", fmt.Sprint(cmd.Process.Pid))
		var stdout, stderr strings.Builder
		c.Stdout, c.Stderr = &stdout, &stderr
		start := time.Now()
		err := c.Run()
		held := ctx.Err() != nil
		cancel()
		if held {
			t.Fatalf("run %d: hotpatch stats was held by the program for %v (killed; program said %q)", i, time.Since(start).Round(time.Second), drain(said))
		}
		if err != nil || stdout.Len() == 0 {
			t.Fatalf("run %d: hotpatch stats: %v, stderr %q, stdout %.200q", i, err, stderr.String(), stdout.String())
		}
		// The program reports the opens it has seen, then "end".
		if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		if s := untilEnd(said); s != "" {
			t.Fatalf("run %d: root's hotpatch opened files of the program's (program said %q)", i, s)
		}
	}
}

// untilEnd returns what the program said before its "end" line, joined.
func untilEnd(ch chan string) string {
	var got []string
	for s := range ch {
		if s == "end" {
			break
		}
		got = append(got, s)
	}
	return strings.Join(got, "; ")
}

// drain returns what is waiting on ch, joined.
func drain(ch chan string) string {
	var got []string
	for {
		select {
		case s, ok := <-ch:
			if !ok {
				return strings.Join(got, "; ")
			}
			got = append(got, s)
		default:
			return strings.Join(got, "; ")
		}
	}
}

func copyInto(t *testing.T, from, dir string) string {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(dir, filepath.Base(from))
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return to
}
