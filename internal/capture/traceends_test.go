package capture

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestTraceUntilProcessEnds: a program that ends during a trace (it exits,
// or is killed) ends the trace there: exit 0, one note that says so, and
// the file holds what the program recorded until then. It used to wait
// out --duration and then fail (exit 4, "target process exited") with the
// file thrown away: every call recorded was lost.
func TestTraceUntilProcessEnds(t *testing.T) {
	for _, how := range []string{"exit", "kill"} {
		t.Run(how, func(t *testing.T) {
			p := startCold(t)
			region, err := shm.OpenPID(p.Pid)
			if err != nil {
				t.Fatal(err)
			}
			defer region.Close()
			out := filepath.Join(t.TempDir(), "t.pftrace")
			_, stderr, done := startCapture(t, region, shm.CtlTrace, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "work", "--enable", "leaf",
				"--duration", "10m", "-o", out)
			// work runs (traced) before the program ends
			p.AwaitProgress(p.Symbol(p.Cmd.Path, "progress"), 20000)
			if how == "exit" {
				if o, _ := p.Finish(); !strings.Contains(o, "wrong=0") {
					t.Fatalf("program output %q", o)
				}
			} else {
				p.Cmd.Process.Kill()
				p.Wait()
			}
			select {
			case err = <-done:
			case <-time.After(2 * time.Minute):
				// A watchdog, not a measure: the trace asked for 10 minutes.
				t.Fatalf("the trace was still running 2 minutes after the program ended (stderr %q)", stderr.String())
			}
			if err != nil || !strings.Contains(stderr.String(), "the process ended") {
				t.Fatalf("trace: %v, stderr %q; want exit 0 and a note that the process ended", err, stderr.String())
			}
			r := run(t, "replay", out)
			if n := strings.Count(r.Stdout, "work("); n == 0 {
				t.Fatalf("the trace holds no call of work (trace stderr %q):\n%.2000s", stderr.String(), r.Stdout)
			}
		})
	}
}

// TestProfileUntilProcessEnds: the same for a profile: a program that exits
// during it ends it there, exit 0 with a note, and the profile of what it
// recorded is written (it used to wait out --duration, fail with exit 4
// and write nothing).
func TestProfileUntilProcessEnds(t *testing.T) {
	p := startCold(t)
	region, err := shm.OpenPID(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	out := filepath.Join(t.TempDir(), "p.pprof")
	stdout, stderr, done := startCapture(t, region, shm.CtlQuota, "profile", "--pid", fmt.Sprint(p.Pid), "--enable", "work", "--enable", "leaf",
		"--duration", "10m", "--epoch", "50ms", "--samples", "100", "-o", out)
	// The quota goes on before the probes (D57), so the control word does
	// not say the profile's first Apply has returned; until it has, the
	// program's end races it, and that Apply fails (exit 4, nothing
	// recorded: not the case under test; it failed so at load 15, its read
	// after finding the process gone). Its loop starting a second quota
	// epoch does say so.
	e0 := region.QuotaEpoch()
	waitFor(t, "the profile's second epoch", func() bool { return region.QuotaEpoch() != e0 })
	p.AwaitProgress(p.Symbol(p.Cmd.Path, "progress"), 20000)
	if o, _ := p.Finish(); !strings.Contains(o, "wrong=0") {
		t.Fatalf("program output %q", o)
	}
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		// A watchdog, not a measure: the profile asked for 10 minutes.
		t.Fatalf("the profile was still running 2 minutes after the program ended (stderr %q)", stderr.String())
	}
	if err != nil || !strings.Contains(stderr.String(), "the process ended") || !strings.Contains(stdout.String(), "work") {
		t.Fatalf("profile: %v, stdout %q, stderr %q; want exit 0, work's row and a note that the process ended", err, stdout.String(), stderr.String())
	}
	if st, err := os.Stat(out); err != nil || st.Size() == 0 {
		t.Fatalf("profile file: %v", err)
	}
}

// TestTraceUntilProcessExecs: a program that runs exec during a trace ends
// the trace there too (its probes and rings went with the old image;
// nothing more can be recorded): exit 0, one note that it ran exec, the
// file with what it recorded. It used to run on for the whole --duration.
func TestTraceUntilProcessExecs(t *testing.T) {
	fx := testutil.Spec{Compiler: "gcc", Opt: "-O2", PIE: testutil.Bool(false), Sources: []string{"reexec.c"}}
	p := startColdSpec(t, fx, nil)
	region, err := shm.OpenPID(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	out := filepath.Join(t.TempDir(), "t.pftrace")
	_, stderr, done := startCapture(t, region, shm.CtlTrace, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "work",
		"--duration", "10m", "-o", out)
	// work runs (traced) before the exec: sink is the sum of its arguments
	p.AwaitProgress(p.Symbol(p.Cmd.Path, "sink"), 1<<30)
	if err := syscall.Kill(p.Pid, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		// A watchdog, not a measure: the trace asked for 10 minutes.
		t.Fatalf("the trace was still running 2 minutes after the program ran exec (stderr %q)", stderr.String())
	}
	if err != nil || !strings.Contains(stderr.String(), "ran exec") {
		t.Fatalf("trace: %v, stderr %q; want exit 0 and a note that the process ran exec", err, stderr.String())
	}
	r := run(t, "replay", out)
	if n := strings.Count(r.Stdout, "work("); n == 0 {
		t.Fatalf("the trace holds no call of work (trace stderr %q):\n%.2000s", stderr.String(), r.Stdout)
	}
	if o, _ := p.Finish(); !strings.Contains(o, "done 1") {
		t.Fatalf("program output %q, want done 1 (the new image ended)", o)
	}
}

// startCapture runs hotpatch with args (a trace or a profile of the
// process region belongs to) and returns once the control bit on is set:
// the capture has started. done receives its exit; a capture still
// running when the test ends is killed.
func startCapture(t *testing.T, region *shm.Region, on uint32, args ...string) (stdout, stderr *strings.Builder, done <-chan error) {
	t.Helper()
	cmd := exec.Command(testutil.Command(t, "hotpatch"), args...)
	stdout, stderr = new(strings.Builder), new(strings.Builder)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := testutil.StartBound(cmd); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
	})
	waitFor(t, "the "+args[0]+" to start", func() bool { return region.Control()&on != 0 })
	return stdout, stderr, exited
}
