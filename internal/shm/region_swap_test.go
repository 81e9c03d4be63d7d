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

	"golang.org/x/sys/unix"

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
	bin := testutil.CopyInto(t, built, dir)
	lib := testutil.CopyInto(t, buildRuntime(t, "gcc"), dir)

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
		err := testutil.RunBound(c)
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

// TestOutputMapsReplaced (D88): `hotpatch stats --input FILE` names the
// functions of an exited process from the maps copy its output file
// carries, opening the objects listed there. The file and the objects are
// the process's user's: after the run, a listed library replaced by a FIFO
// held root's stats in open forever (os.Open of the path); a link to a
// device had the device opened. Now only a regular file is opened (O_PATH
// first, then that very file), and only the inode the process mapped: the
// library's functions are left unnamed, the rest of the report is there.
func TestOutputMapsReplaced(t *testing.T) {
	bin, libdir := buildCounts(t, "gcc", "-O2")
	dir := t.TempDir()
	lib := testutil.CopyInto(t, filepath.Join(libdir, "libfix.so"), dir)
	out := filepath.Join(dir, "out")
	mustRun(t, buildRuntime(t, "gcc"), bin, []string{"LD_LIBRARY_PATH=" + dir, "EDGEPROBE_OUTPUT=" + out}, "10")
	if err := os.Remove(lib); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(lib, 0o600); err != nil {
		t.Fatal(err)
	}
	hp := testutil.Command(t, "hotpatch") // built before the bound starts
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c := exec.CommandContext(ctx, hp, "stats", "--input", out)
	var stdout, stderr strings.Builder
	c.Stdout, c.Stderr = &stdout, &stderr
	err := testutil.RunBound(c)
	if ctx.Err() != nil {
		t.Fatalf("hotpatch stats --input: still running after 15 s (killed): it opened the FIFO put where the library was")
	}
	if err != nil || !strings.Contains(stdout.String(), "main") {
		t.Fatalf("hotpatch stats --input: %v, stderr %q, stdout %.300q; want the report of the program's own functions", err, stderr.String(), stdout.String())
	}
}

// TestOpenInputNotRegular (D88): `hotpatch stats --input PATH` where PATH,
// another user's output file, has been replaced by a FIFO: root's
// hotpatch opened it (O_RDWR, which as root does not wait; a link to a
// device would have opened the device) before finding it empty. Now it is
// refused in one line without being opened (an inotify watch sees no
// open).
func TestOpenInputNotRegular(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "out")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	in, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(in)
	if _, err := unix.InotifyAddWatch(in, fifo, unix.IN_OPEN); err != nil {
		t.Fatal(err)
	}
	hp := testutil.Command(t, "hotpatch") // built before the bound starts
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c := exec.CommandContext(ctx, hp, "stats", "--input", fifo)
	var stderr strings.Builder
	c.Stderr = &stderr
	err = testutil.RunBound(c)
	if ctx.Err() != nil {
		t.Fatalf("hotpatch stats --input FIFO: still running after 15 s (killed)")
	}
	var buf [4096]byte
	if n, _ := unix.Read(in, buf[:]); n > 0 {
		t.Errorf("hotpatch stats --input opened the FIFO (stderr %q)", stderr.String())
	}
	if err == nil || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), "not a regular file") {
		t.Errorf("hotpatch stats --input FIFO: %v, stderr %q; want one line saying it is not a regular file", err, stderr.String())
	}
}
