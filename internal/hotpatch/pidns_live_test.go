package hotpatch

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestPidNamespaceKilledMidPatch: TestLeaderExitedKilledMidPatch's
// "session-holds" case with the target in a pid namespace of its own, with
// its own /proc (as in a container), hotpatch outside it, given the outer
// pid. A hotpatch is SIGKILLed mid-int3; a session opened after the kill
// holds the process (the leader's seize, or the flock of /proc/PID/fd and
// an idle thread's seize once the main thread has exited); then the
// worker, which nobody traces, meets the int3. The runtime's SIGTRAP
// handler must wait while the session holds, not repair. Inside the
// namespace TracerPid names a tracer outside it as 0, and the handler's
// flock of its /proc/self/fd is another inode than the one hotpatch locked
// through the host's /proc: before (D101) the handler saw nobody and
// repaired under the session. Now hotpatch holds a flock of the runtime's
// region memfd, one inode in every namespace, which the handler checks.
// Once the session ends, the handler repairs, and the step's 1000 calls
// all ran.
func TestPidNamespaceKilledMidPatch(t *testing.T) {
	testutil.RequirePtrace(t)
	hooks := hooksLib(t)
	rt := testutil.Runtime(t, "gcc")
	fix, list := leaderFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	for _, mode := range []string{"leader-alive", "leader-exited"} {
		t.Run(mode, func(t *testing.T) {
			args := []string{"steps"}
			if mode == "leader-alive" {
				args = append(args, "alive")
			}
			p := testutil.StartPidNS(t, []string{"LD_PRELOAD=" + hooks + ":" + rt}, fix.Path, args...)
			if mode == "leader-exited" {
				awaitLeaderExited(t, p.Pid)
			}
			s := &subject{Process: p, probeArgs: []string{"--probes", list}}
			killMidPatch(t, s)
			ss := startSession(t, s)
			ss.send(t, "stats")
			if l := ss.read(t); !l.OK {
				t.Fatalf("session: %+v", l)
			}
			if err := os.WriteFile(p.StopFile+".1", nil, 0o644); err != nil {
				t.Fatal(err)
			}
			awaitHeldUnrepaired(t, s, "a session (outside its pid namespace)")
			ss.in.Close()
			ss.wait(t)
			if l := p.Line(); l != "step 1" {
				t.Fatalf("step 1: %q", l)
			}
			traps, repairs, holds := inflightCounters(t, s)
			t.Logf("handler took %d traps, repaired %d sites, held %d", traps, repairs, holds)
			if traps == 0 || repairs == 0 {
				t.Fatalf("traps %d, repairs %d: the handler must have taken the trap and repaired once the session ended", traps, repairs)
			}
			for _, st := range listStates(t, fmt.Sprint(p.Pid), list) {
				if st.State != "on" && st.State != "off" {
					t.Fatalf("probe %d (%s %s) left %s: %s", st.ID, st.Kind, st.Function, st.State, st.Bytes)
				}
			}
			out, errOut := p.Finish()
			if !strings.HasPrefix(out, "done 1") {
				t.Fatalf("leaderexit: stdout %q, stderr %q", out, errOut)
			}
		})
	}
}

// TestLeaderExitedOtherProc: D95's flock of /proc/PID/fd is per procfs
// instance, so a hotpatch reading another /proc (a second mount of proc in
// a mount namespace of its own, as a container has) does not see a session
// that holds a process whose main thread has exited. It is still refused,
// in one line, naming the session: the anchor, the lowest live thread,
// which both seize, is the session's (D101 documents what is left when the
// anchor changes). The session's state is unchanged.
func TestLeaderExitedOtherProc(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireRoot(t, "mounts a second procfs")
	testutil.RequireTool(t, "unshare")
	fix, list := leaderFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	p := testutil.Start(t, []string{"LD_PRELOAD=" + hooksLib(t)}, fix.Path, "steps")
	awaitLeaderExited(t, p.Pid)
	pid := fmt.Sprint(p.Pid)
	ss := startSession(t, &subject{Process: p, probeArgs: []string{"--probes", list}})
	ss.send(t, "enable work")
	if l := ss.read(t); !l.OK || l.Changed != 2 {
		t.Fatalf("session enable: %+v", l)
	}
	for _, proto := range []string{"flip", "int3"} {
		hp := exec.Command("unshare", "-m", "sh", "-c", `mount -t proc proc /proc && exec "$0" "$@"`,
			testutil.Command(t, "hotpatch"), "--pid", pid, "--probes", list, "--protocol", proto, "--disable", "work")
		var stdout, stderr strings.Builder
		hp.Stdout, hp.Stderr = &stdout, &stderr
		err := testutil.RunBound(hp)
		t.Logf("%s through another /proc: %s", proto, strings.TrimSpace(stderr.String()))
		if err == nil || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), "(hotpatch)") {
			t.Errorf("%s through another /proc while a session holds the process: %v, stdout %q, stderr %q; want a failure, one line naming the session",
				proto, err, stdout.String(), stderr.String())
		}
	}
	for _, st := range listStates(t, pid, list) {
		if st.Function == "work" && st.State != "on" {
			t.Errorf("work's probe %d is %s after the refused toggles; want the session's on", st.ID, st.State)
		}
	}
	ss.in.Close()
	ss.wait(t)
	p.Finish()
}

// TestReanchorOtherTracer: a flip session holds a process whose main
// thread has exited through its anchor (the lowest live thread), which
// then exits. A second session, reading another /proc (a second procfs
// mount: D95's flock of /proc/PID/fd is another inode there), takes the
// lock: its flock, the zombie leader's TracerPid 0, the seize of the
// lowest live thread. The first session's next command must not go on
// beside it: before, reanchor skipped the thread another tracer held and
// seized the next one, and both sessions changed the sites (the first's
// `disable work` turned work off under the second). Now it fails in one
// result line naming the other tracer, and changes nothing.
func TestReanchorOtherTracer(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireRoot(t, "mounts a second procfs")
	testutil.RequireTool(t, "unshare")
	fix, list := leaderFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	p := testutil.Start(t, []string{"LD_PRELOAD=" + hooksLib(t)}, fix.Path, "steps", "idle2")
	awaitLeaderExited(t, p.Pid)
	pid := fmt.Sprint(p.Pid)
	tasks := func() int {
		ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", p.Pid))
		return len(ents)
	}
	a := startSession(t, &subject{Process: p, probeArgs: []string{"--probes", list}})
	a.send(t, "enable work")
	if l := a.read(t); !l.OK || l.Changed != 2 {
		t.Fatalf("session A enable: %+v", l)
	}
	// A's anchor, the first idle thread, exits.
	before := tasks()
	if err := os.WriteFile(p.StopFile+".idle", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); tasks() >= before; time.Sleep(time.Millisecond) { // polling, not synchronisation
		if time.Now().After(deadline) {
			t.Fatal("the first idle thread did not exit in a minute")
		}
	}
	// Session B, through another /proc, takes the second idle thread.
	b := &session{cmd: exec.Command("unshare", "-m", "sh", "-c", `mount -t proc proc /proc && exec "$0" "$@"`,
		testutil.Command(t, "hotpatch"), "session", "--pid", pid, "--probes", list)}
	b.cmd.Stderr = &b.stderr
	var err error
	if b.in, err = b.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := b.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	b.out = bufio.NewReader(out)
	if err := testutil.StartBound(b.cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if b.cmd.ProcessState == nil {
			b.cmd.Process.Kill()
			b.cmd.Wait()
		}
	})
	b.send(t, "stats")
	if l := b.read(t); !l.OK {
		t.Fatalf("session B (another /proc): %+v, stderr %q", l, b.stderr.String())
	}
	// A's next command, while B holds the process.
	a.send(t, "disable work")
	l := a.read(t)
	t.Logf("session A while B holds: %+v", l)
	if l.OK || l.Changed != 0 || !strings.Contains(l.Error, "traced by") {
		t.Errorf("session A's disable while B holds the process through another /proc: %+v; want a failure naming the other tracer, nothing changed", l)
	}
	for _, st := range listStates(t, pid, list) {
		if st.Function == "work" && st.State != "on" {
			t.Errorf("work's probe %d is %s: session A changed it while B held the process", st.ID, st.State)
		}
	}
	b.in.Close()
	b.wait(t)
	a.in.Close()
	a.cmd.Wait()
	if err := os.WriteFile(p.StopFile+".idle2", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p.Finish()
}

// TestHandlerKeepsProgramLock: the runtime's SIGTRAP handler looks for a
// hotpatch's flock of the region's memfd (D101). A program that closed
// that descriptor and put a lock file of its own at the same number, with
// an exclusive flock through that very open file, meets an int3 a killed
// hotpatch left: the handler repairs (no hotpatch holds the process), and
// the program's lock must still be held afterwards. The first version
// flocked the descriptor by number: its LOCK_EX shared the program's open
// file and its LOCK_UN released the program's lock (the lead's review).
func TestHandlerKeepsProgramLock(t *testing.T) {
	testutil.RequirePtrace(t)
	rt := testutil.Runtime(t, "gcc")
	fx := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"fdlock.c"}})
	list := testutil.ProbeList(t, filepath.Join(filepath.Dir(fx.Path), "fdlock.json"), fx.Path)
	lockFile := filepath.Join(t.TempDir(), "program.lock")
	p := testutil.Start(t, []string{"LD_PRELOAD=" + rt}, fx.Path, lockFile)
	s := &subject{Process: p, probeArgs: []string{"--probes", list}}
	killMidPatch(t, s)
	if err := os.WriteFile(p.StopFile+".swap", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if l := p.Line(); !strings.HasPrefix(l, "locked ") {
		t.Fatalf("fixture: %q", l)
	}
	held := func() bool {
		t.Helper()
		f, err := os.OpenFile(lockFile, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err != nil && err != unix.EWOULDBLOCK {
			t.Fatal(err)
		}
		return err == unix.EWOULDBLOCK // our lock, if we got it, goes with f
	}
	if !held() {
		t.Fatal("the program's lock is not held before the step")
	}
	if err := os.WriteFile(p.StopFile+".1", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if l := p.Line(); l != "step 1" {
		t.Fatalf("step 1: %q", l)
	}
	if !held() {
		t.Fatal("the program's flock of its own file was released by the runtime's SIGTRAP handler")
	}
	for _, st := range listStates(t, fmt.Sprint(p.Pid), list) {
		if st.State != "on" && st.State != "off" {
			t.Fatalf("probe %d (%s %s) left %s: %s", st.ID, st.Kind, st.Function, st.State, st.Bytes)
		}
	}
	p.Finish()
}
