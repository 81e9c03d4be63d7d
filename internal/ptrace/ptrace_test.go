package ptrace_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

type target struct {
	cmd    *exec.Cmd
	pid    int
	stdin  interface{ Close() error }
	out    *bufio.Reader
	stderr testutil.SyncBuffer
	done   bool
}

// start runs the stress fixture (testdata/fixtures/stress.c) and waits for
// its ready line. Never Wait for it while a tracer is attached: a wait by
// this process would consume the tracer's events.
func start(t *testing.T, args ...string) *target {
	t.Helper()
	testutil.RequirePtrace(t)
	fix := testutil.Build(t, testutil.Spec{Sources: []string{"stress.c"}, NoInstr: true})
	tg := &target{cmd: exec.Command(fix.Path, args...)}
	tg.cmd.Stderr = &tg.stderr
	in, err := tg.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	tg.stdin = in
	out, err := tg.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := testutil.StartBound(tg.cmd); err != nil {
		t.Fatal(err)
	}
	tg.pid = tg.cmd.Process.Pid
	t.Cleanup(func() {
		if !tg.done {
			tg.cmd.Process.Kill()
			tg.cmd.Wait()
		}
	})
	tg.out = bufio.NewReader(out)
	if line, err := tg.out.ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready") {
		t.Fatalf("%s: no ready line: %q %v", fix.Command, line, err)
	}
	return tg
}

func (tg *target) finish(t *testing.T) (string, error) {
	tg.stdin.Close()
	line, _ := tg.out.ReadString('\n')
	err := tg.cmd.Wait()
	tg.done = true
	return strings.TrimSpace(line), err
}

// taskStates returns each thread's state letter and TracerPid.
func taskStates(t *testing.T, pid int) map[int]string {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, e := range ents {
		tid, _ := strconv.Atoi(e.Name())
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/status", pid, tid))
		if err != nil {
			continue
		}
		var state, tracer string
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "State:"); ok {
				state = strings.Fields(v)[0]
			}
			if v, ok := strings.CutPrefix(l, "TracerPid:"); ok {
				tracer = strings.TrimSpace(v)
			}
		}
		out[tid] = state + " tracer=" + tracer
	}
	return out
}

func requireUntraced(t *testing.T, pid int) {
	t.Helper()
	for tid, s := range taskStates(t, pid) {
		if !strings.HasSuffix(s, "tracer=0") || strings.HasPrefix(s, "t") || strings.HasPrefix(s, "T") {
			t.Errorf("after detach thread %d is %s", tid, s)
		}
	}
}

func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond) // polling interval for a state with no event
	}
}

func TestAttachStopSyncDetach(t *testing.T) {
	tg := start(t, "4", "churn")
	tr, err := ptrace.Attach(tg.pid, ptrace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(tr.Threads()); n < 6 {
		t.Errorf("tracking %d threads, want at least main + 4 executors + churn", n)
	}
	poll(t, "a clone event", func() bool { return tr.Stats().Clones > 0 })

	states, err := tr.StopAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		if st := taskStates(t, tg.pid)[s.Tid]; !strings.HasPrefix(st, "t") {
			t.Errorf("thread %d is %q while the world is stopped", s.Tid, st)
		}
		if s.Regs.Rip == 0 {
			t.Errorf("thread %d: no registers", s.Tid)
		}
	}
	if len(states) != len(tr.Threads()) {
		t.Errorf("StopAll returned %d threads, tracking %d", len(states), len(tr.Threads()))
	}
	if err := tr.ResumeAll(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		if err := tr.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	stats := tr.Stats()
	if stats.Syncs != 100 {
		t.Errorf("Syncs = %d", stats.Syncs)
	}
	if err := tr.Detach(); err != nil {
		t.Fatal(err)
	}
	requireUntraced(t, tg.pid)
	if err := tr.Sync(context.Background()); !errors.Is(err, ptrace.ErrDetached) {
		t.Errorf("Sync after Detach: %v", err)
	}
	line, err := tg.finish(t)
	if err != nil || !strings.Contains(line, "result=ok") {
		t.Fatalf("fixture: %v %q %s", err, line, tg.stderr.String())
	}
	t.Logf("%+v; %s", stats, line)
}

// TestSignalsPassThrough: a signal sent to a traced thread reaches the
// program's handler unchanged; SIGSTOP/SIGCONT job control still works.
func TestSignalsPassThrough(t *testing.T) {
	tg := start(t, "2")
	tr, err := ptrace.Attach(tg.pid, ptrace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var exec1 int
	for _, tid := range tr.Threads() {
		if tid != tg.pid {
			exec1 = tid
		}
	}
	// SIGTRAP from tgkill is not an int3 of ours: it must reach the fixture's
	// handler, which reports it as "torn sig=5".
	if err := syscall.Tgkill(tg.pid, exec1, syscall.SIGTRAP); err != nil {
		t.Fatal(err)
	}
	poll(t, "the fixture's SIGTRAP handler", func() bool { return strings.Contains(tg.stderrString(), "torn sig=5") })

	syscall.Kill(tg.pid, syscall.SIGSTOP)
	poll(t, "group-stop", func() bool {
		for _, s := range taskStates(t, tg.pid) {
			if !strings.HasPrefix(s, "T") && !strings.HasPrefix(s, "t") {
				return false
			}
		}
		return true
	})
	syscall.Kill(tg.pid, syscall.SIGCONT)
	poll(t, "continue", func() bool {
		for _, s := range taskStates(t, tg.pid) {
			if strings.HasPrefix(s, "T") || strings.HasPrefix(s, "t") {
				return false
			}
		}
		return true
	})
	stats := tr.Stats()
	if stats.Signals == 0 || stats.GroupStops == 0 {
		t.Errorf("stats %+v: want re-injected signals and group-stops", stats)
	}
	if err := tr.Detach(); err != nil {
		t.Fatal(err)
	}
	requireUntraced(t, tg.pid)
	line, err := tg.finish(t)
	// The fixture counts the SIGTRAP as a torn instruction and exits 3.
	if !strings.Contains(line, "torn=1") {
		t.Fatalf("fixture: %v %q %s", err, line, tg.stderr.String())
	}
	t.Logf("%+v; %s", stats, line)
}

func (tg *target) stderrString() string { return tg.stderr.String() }

func TestLeaderOnlyWrite(t *testing.T) {
	tg := start(t, "2")
	tr, err := ptrace.Attach(tg.pid, ptrace.Options{LeaderOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.StopAll(context.Background()); err == nil {
		t.Error("StopAll with LeaderOnly succeeded")
	}
	// Rewrite the first byte of the executable's text with its own value.
	maps, _ := os.ReadFile(fmt.Sprintf("/proc/%d/maps", tg.pid))
	var lo uint64
	for _, l := range strings.Split(string(maps), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == "r-xp" {
			lo, _ = strconv.ParseUint(strings.Split(f[0], "-")[0], 16, 64)
			break
		}
	}
	b := make([]byte, 1)
	if err := tr.ReadMem(lo, b); err != nil {
		t.Fatal(err)
	}
	if err := tr.WriteMem(lo, b); err != nil {
		t.Fatal(err)
	}
	if err := tr.Detach(); err != nil {
		t.Fatal(err)
	}
	requireUntraced(t, tg.pid)
	if line, err := tg.finish(t); err != nil {
		t.Fatalf("%v %q", err, line)
	}
}

// TestDoMem: the memory DoMem lends reads and writes what the tracer's own
// ReadMem sees, inside a Do as well (no deadlock: it runs directly there),
// and stops working once the DoMem that lent it returns, whichever
// goroutine then uses it.
func TestDoMem(t *testing.T) {
	tg := start(t, "2")
	tr, err := ptrace.Attach(tg.pid, ptrace.Options{LeaderOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	maps, _ := os.ReadFile(fmt.Sprintf("/proc/%d/maps", tg.pid))
	var lo uint64
	for _, l := range strings.Split(string(maps), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == "r-xp" {
			lo, _ = strconv.ParseUint(strings.Split(f[0], "-")[0], 16, 64)
			break
		}
	}
	want := make([]byte, 64)
	if err := tr.ReadMem(lo, want); err != nil {
		t.Fatal(err)
	}
	var leaked *ptrace.ThreadMem
	err = tr.DoMem(func(m *ptrace.ThreadMem) error {
		leaked = m
		got := make([]byte, 64)
		if err := m.ReadMem(lo, got); err != nil {
			return err
		}
		if string(got) != string(want) {
			return fmt.Errorf("ThreadMem read % x, tracer read % x", got, want)
		}
		// Text is read-only: this write needs FOLL_FORCE, as a site's does.
		return m.WriteMem(lo, got[:1])
	})
	if err != nil {
		t.Fatal(err)
	}
	// Nested in a Do, DoMem runs on the same thread without a hand-off.
	if err := tr.Do(func() error {
		return tr.DoMem(func(m *ptrace.ThreadMem) error { return m.ReadMem(lo, make([]byte, 8)) })
	}); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- leaked.WriteMem(lo, want[:1]) }()
	if err := <-errc; !errors.Is(err, ptrace.ErrNotLent) {
		t.Errorf("write through a ThreadMem after its DoMem returned: %v, want ErrNotLent", err)
	}
	if err := leaked.ReadMem(lo, make([]byte, 8)); !errors.Is(err, ptrace.ErrNotLent) {
		t.Errorf("read through a ThreadMem after its DoMem returned: %v, want ErrNotLent", err)
	}
	if err := tr.Detach(); err != nil {
		t.Fatal(err)
	}
	if err := tr.DoMem(func(m *ptrace.ThreadMem) error { return nil }); !errors.Is(err, ptrace.ErrDetached) {
		t.Errorf("DoMem after Detach: %v, want ErrDetached", err)
	}
	requireUntraced(t, tg.pid)
	if line, err := tg.finish(t); err != nil {
		t.Fatalf("%v %q", err, line)
	}
}

func TestAttachTwice(t *testing.T) {
	tg := start(t, "1")
	tr, err := ptrace.Attach(tg.pid, ptrace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Detach()
	if _, err := ptrace.Attach(tg.pid, ptrace.Options{}); !errors.Is(err, ptrace.ErrPermission) {
		t.Errorf("second Attach: want ErrPermission, got %v", err)
	}
}
