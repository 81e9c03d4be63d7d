package ptrace_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// textStart is the first address of pid's first executable mapping.
func textStart(t *testing.T, pid int) uint64 {
	t.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(maps), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == "r-xp" {
			lo, _ := strconv.ParseUint(strings.Split(f[0], "-")[0], 16, 64)
			return lo
		}
	}
	t.Fatalf("pid %d maps no text", pid)
	return 0
}

// TestRunInline: the first tracer attached inside Run is served on Run's
// own thread (its requests run there, from no other goroutine), writes
// text as the leader-only mode must, and is released by the thread's
// exit: nothing of the process is traced once Run returns, without a wait
// by the caller, and the process ran on undisturbed.
func TestRunInline(t *testing.T) {
	tg := start(t, "2")
	lo := textStart(t, tg.pid)
	var runTid, reqTid, tracerAfterDetach int
	err := ptrace.Run(func() error {
		runTid = unix.Gettid()
		if runTid == os.Getpid() {
			return errors.New("Run's function runs on the main thread")
		}
		tr, err := ptrace.Attach(tg.pid, ptrace.Options{LeaderOnly: true})
		if err != nil {
			return err
		}
		if err := tr.Do(func() error { reqTid = unix.Gettid(); return nil }); err != nil {
			return err
		}
		b := make([]byte, 1)
		if err := tr.ReadMem(lo, b); err != nil {
			return err
		}
		if err := tr.WriteMem(lo, b); err != nil { // text: needs the tracer's FOLL_FORCE
			return err
		}
		// Requests from any other goroutine are refused, not served on
		// the wrong thread.
		errc := make(chan error, 1)
		go func() { errc <- tr.ReadMem(lo, b) }()
		if err := <-errc; !errors.Is(err, ptrace.ErrWrongThread) {
			return fmt.Errorf("ReadMem from another goroutine: %v, want ErrWrongThread", err)
		}
		// Run inside Run runs inline, on the same thread.
		if err := ptrace.Run(func() error {
			if unix.Gettid() != runTid {
				return errors.New("nested Run moved to another thread")
			}
			return nil
		}); err != nil {
			return err
		}
		if err := tr.Detach(); err != nil {
			return err
		}
		// Released by the thread's exit, not before: the leader-only
		// mode stops nothing, so there is no detach request to make.
		tracerAfterDetach = procfs.TracerPid(tg.pid, 0)
		if err := tr.ReadMem(lo, b); !errors.Is(err, ptrace.ErrDetached) {
			return fmt.Errorf("ReadMem after Detach: %v, want ErrDetached", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if reqTid != runTid {
		t.Errorf("request served on thread %d, Run's thread is %d", reqTid, runTid)
	}
	if tracerAfterDetach != runTid {
		t.Errorf("after the inline Detach the leader's tracer is %d, want Run's thread %d until it exits", tracerAfterDetach, runTid)
	}
	requireUntraced(t, tg.pid) // no poll: Run returned after the release
	if line, err := tg.finish(t); err != nil || !strings.Contains(line, "result=ok") {
		t.Fatalf("fixture: %v %q %s", err, line, tg.stderr.String())
	}
}

// TestRunSecondAttach: one tracer per locked thread. A second tracer
// attached inside Run gets a tracer goroutine of its own and serves
// requests from any goroutine; an attach that fails does not take the
// inline place. Both processes are untraced once Run returns.
func TestRunSecondAttach(t *testing.T) {
	tg1, tg2 := start(t, "1"), start(t, "1")
	err := ptrace.Run(func() error {
		if _, err := ptrace.Attach(1<<30, ptrace.Options{LeaderOnly: true}); !errors.Is(err, ptrace.ErrNoProcess) {
			return fmt.Errorf("attach to no process: %v", err)
		}
		tr1, err := ptrace.Attach(tg1.pid, ptrace.Options{LeaderOnly: true})
		if err != nil {
			return err
		}
		tr2, err := ptrace.Attach(tg2.pid, ptrace.Options{LeaderOnly: true})
		if err != nil {
			return err
		}
		lo1, lo2 := textStart(t, tg1.pid), textStart(t, tg2.pid)
		err1, err2 := make(chan error, 1), make(chan error, 1)
		go func() { err1 <- tr1.ReadMem(lo1, make([]byte, 1)) }()
		go func() { err2 <- tr2.ReadMem(lo2, make([]byte, 1)) }()
		if err := <-err1; !errors.Is(err, ptrace.ErrWrongThread) {
			return fmt.Errorf("read through the inline tracer from another goroutine: %v, want ErrWrongThread", err)
		}
		if err := <-err2; err != nil {
			return fmt.Errorf("read through the second (tracer goroutine) tracer from another goroutine: %v", err)
		}
		if err := tr2.Detach(); err != nil {
			return err
		}
		return tr1.Detach()
	})
	if err != nil {
		t.Fatal(err)
	}
	requireUntraced(t, tg1.pid)
	requireUntraced(t, tg2.pid)
	for _, tg := range []*target{tg1, tg2} {
		if line, err := tg.finish(t); err != nil || !strings.Contains(line, "result=ok") {
			t.Fatalf("fixture: %v %q %s", err, line, tg.stderr.String())
		}
	}
}

// TestRunFull: an inline tracer of every thread (attached so, and one
// upgraded from leader-only) stops, syncs, follows clones and detaches as
// a tracer goroutine does; the process is untraced after Run.
func TestRunFull(t *testing.T) {
	for _, upgrade := range []bool{false, true} {
		t.Run(fmt.Sprintf("upgrade=%v", upgrade), func(t *testing.T) {
			tg := start(t, "2", "churn")
			err := ptrace.Run(func() error {
				tr, err := ptrace.Attach(tg.pid, ptrace.Options{LeaderOnly: upgrade})
				if err != nil {
					return err
				}
				if upgrade {
					if err := tr.Upgrade(); err != nil {
						return err
					}
				}
				for tr.Stats().Clones == 0 {
					tr.Pause(0) // serve events until a churned thread is born
				}
				states, err := tr.StopAll(context.Background())
				if err != nil {
					return err
				}
				for _, s := range states {
					if st := taskStates(t, tg.pid)[s.Tid]; !strings.HasPrefix(st, "t") {
						return fmt.Errorf("thread %d is %q while the world is stopped", s.Tid, st)
					}
				}
				if err := tr.ResumeAll(); err != nil {
					return err
				}
				for i := 0; i < 20; i++ {
					if err := tr.Sync(context.Background()); err != nil {
						return err
					}
				}
				return tr.Detach()
			})
			if err != nil {
				t.Fatal(err)
			}
			requireUntraced(t, tg.pid)
			if line, err := tg.finish(t); err != nil || !strings.Contains(line, "result=ok") {
				t.Fatalf("fixture: %v %q %s", err, line, tg.stderr.String())
			}
		})
	}
}

// TestRunSignals: a leader-only inline tracer passes every signal to the
// leader through unchanged while it serves requests, and a signal whose
// stop it never served (it stopped asking, detached and returned) is
// delivered once the thread's exit releases the leader: sig.c's main
// thread counts exactly the signals its sender sent.
func TestRunSignals(t *testing.T) {
	testutil.RequirePtrace(t)
	fix := testutil.Build(t, testutil.Spec{Sources: []string{"sig.c"}, NoInstr: true})
	const n = 20000
	cmd := exec.Command(fix.Path, strconv.Itoa(n))
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := testutil.StartBound(cmd); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	exited := false
	t.Cleanup(func() {
		if !exited {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	var seen uint64
	err := ptrace.Run(func() error {
		tr, err := ptrace.Attach(pid, ptrace.Options{LeaderOnly: true})
		if err != nil {
			return err
		}
		for tr.Stats().Signals < 100 { // each one a signal-delivery-stop we resumed
			tr.Pause(0)
		}
		// The sender's next signal stops the leader until the release.
		if err := tr.Detach(); err != nil {
			return err
		}
		seen = tr.Stats().Signals
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	requireUntraced(t, pid)
	err = cmd.Wait()
	exited = true
	if got := strings.TrimSpace(out.String()); err != nil || got != fmt.Sprintf("signals %d", n) {
		t.Fatalf("sig.c: %v, %q; want every one of %d signals handled (%d passed through the tracer)", err, got, n, seen)
	}
	t.Logf("%d of %d signals passed through the inline tracer", seen, n)
}
