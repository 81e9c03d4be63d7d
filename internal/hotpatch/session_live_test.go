package hotpatch

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/inject"
	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// sessionLine is one result line of `hotpatch session`.
type sessionLine struct {
	Line      int    `json:"line"`
	OK        bool   `json:"ok"`
	Command   string `json:"command"`
	Changed   int    `json:"changed"`
	Unchanged int    `json:"unchanged"`
	Error     string `json:"error"`
	Exit      int    `json:"exit"`
	Commands  *int   `json:"commands"`
	Toggles   *int   `json:"toggles"`
	Errors    *int   `json:"errors"`
}

// session is a running `hotpatch session` with its stdin and stdout.
type session struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	stderr strings.Builder
}

func startSession(t *testing.T, s *subject, args ...string) *session {
	t.Helper()
	ss := &session{cmd: exec.Command(testutil.Command(t, "hotpatch"), append([]string{"session", "--pid", fmt.Sprint(s.Pid)}, append(s.probeArgs, args...)...)...)}
	ss.cmd.Stderr = &ss.stderr
	var err error
	if ss.in, err = ss.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := ss.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	ss.out = bufio.NewReaderSize(out, 1<<20)
	if err := testutil.StartBound(ss.cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ss.cmd.ProcessState == nil {
			ss.cmd.Process.Kill()
			ss.cmd.Wait()
		}
	})
	return ss
}

func (ss *session) send(t *testing.T, lines ...string) {
	t.Helper()
	if _, err := io.WriteString(ss.in, strings.Join(lines, "\n")+"\n"); err != nil {
		t.Fatal(err)
	}
}

func (ss *session) read(t *testing.T) sessionLine {
	t.Helper()
	b, err := ss.out.ReadBytes('\n')
	if err != nil {
		t.Fatalf("reading a result: %v (stderr %q)", err, ss.stderr.String())
	}
	var l sessionLine
	if err := json.Unmarshal(b, &l); err != nil {
		t.Fatalf("result %q: %v", b, err)
	}
	return l
}

// wait waits for the session to exit and checks it exited 0 having printed
// nothing more.
func (ss *session) wait(t *testing.T) {
	t.Helper()
	rest, _ := io.ReadAll(ss.out)
	if err := ss.cmd.Wait(); err != nil {
		t.Fatalf("session: %v (stderr %q)", err, ss.stderr.String())
	}
	if len(rest) > 0 {
		t.Fatalf("session printed more than asked: %q", rest)
	}
}

// TestSessionProtocol: each line gets its result in order; a bad line or a
// failed command gets a JSON error with hotpatch's exit code and the session
// goes on; end of input ends it with exit 0, detached and unlocked.
func TestSessionProtocol(t *testing.T) {
	testutil.RequirePtrace(t)
	s := startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "flip", true)
	s.expectFrozen(t, "cold at start")
	ss := startSession(t, s)
	ss.send(t, "enable work --kind entry")
	if l := ss.read(t); !l.OK || l.Line != 1 || l.Command != "enable" || l.Changed != 1 {
		t.Fatalf("line 1: %+v", l)
	}
	s.expectMoving(t, "work's entry on, from the session", true, false)
	ss.send(t, "", "# a comment", "frobnicate work", "enable nosuch", "enable", "disable work --kind sideways",
		"enable work leaf", "stats", "disable *")
	want := []struct {
		line int
		ok   bool
		exit int
		err  string
	}{
		{4, false, 2, "unknown command"},
		{5, false, 3, "no probe matched"},
		{6, false, 2, "give a selector"},
		{7, false, 2, "sideways"},
		{8, true, 0, ""},
		{9, true, 0, ""},
		{10, true, 0, ""},
	}
	for _, w := range want {
		l := ss.read(t)
		if l.Line != w.line || l.OK != w.ok || l.Exit != w.exit || !strings.Contains(l.Error, w.err) {
			t.Fatalf("line %d: got %+v, want ok=%v exit=%d error ~%q", w.line, l, w.ok, w.exit, w.err)
		}
		switch l.Line {
		case 8: // work's exit and leaf's two; work's entry was on
			if l.Changed != 3 || l.Unchanged != 1 {
				t.Fatalf("enable work leaf: %+v", l)
			}
		case 9:
			if l.Commands == nil || *l.Commands != 7 || *l.Toggles != 4 || *l.Errors != 4 {
				t.Fatalf("stats: %+v", l)
			}
		case 10:
			if l.Changed != 4 {
				t.Fatalf("disable *: %+v", l)
			}
		}
	}
	ss.in.Close()
	ss.wait(t)
	if tp := tracerOf(s.Pid); tp != 0 {
		t.Fatalf("after the session, TracerPid is %d", tp)
	}
	s.expectFrozen(t, "every probe off after the session")
	s.hotpatch(t, "--enable", "leaf") // the lock is free again
	s.expectMoving(t, "leaf on, by a single call after the session", true, true)
	s.finish(t)
}

// TestSessionInterrupt: SIGINT ends a session that is waiting for input:
// exit 0, tracer detached, the probes as its commands left them.
func TestSessionInterrupt(t *testing.T) {
	testutil.RequirePtrace(t)
	s := startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "flip", true)
	ss := startSession(t, s)
	ss.send(t, "enable leaf")
	if l := ss.read(t); !l.OK || l.Changed != 2 {
		t.Fatalf("enable leaf: %+v", l)
	}
	// TracerPid names the tracing thread: one of the session's.
	if tp := tracerOf(s.Pid); tp == 0 || !exists(fmt.Sprintf("/proc/%d/task/%d", ss.cmd.Process.Pid, tp)) {
		t.Fatalf("during the session, TracerPid is %d, not a thread of the session (pid %d)", tp, ss.cmd.Process.Pid)
	}
	if err := ss.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { ss.wait(t); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the session did not end within 30 s of SIGINT")
	}
	if tp := tracerOf(s.Pid); tp != 0 {
		t.Fatalf("after SIGINT, TracerPid is %d", tp)
	}
	s.expectMoving(t, "leaf stays on after the session", true, true)
	s.hotpatch(t, "--disable", "leaf")
	s.finish(t)
}

// TestSessionStorm: a script streams 20,000 toggles of two functions'
// probes through one session while the workers check every result they
// compute; every toggle succeeds, the program never computes a wrong
// value, and the probes end as the last command left them.
func TestSessionStorm(t *testing.T) {
	testutil.RequirePtrace(t)
	s := startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "flip", true)
	ss := startSession(t, s)
	const n = 20000
	var script strings.Builder
	for i := 0; i < n/2; i++ {
		script.WriteString("enable leaf work\ndisable leaf work\n")
	}
	script.WriteString("stats\n")
	go func() {
		io.WriteString(ss.in, script.String())
		ss.in.Close()
	}()
	for i := 1; i <= n; i++ {
		l := ss.read(t)
		if !l.OK || l.Line != i || l.Changed != 4 {
			t.Fatalf("toggle %d: %+v", i, l)
		}
	}
	if l := ss.read(t); l.Toggles == nil || *l.Toggles != 4*n || *l.Errors != 0 {
		t.Fatalf("stats: %+v", l)
	}
	ss.wait(t)
	s.expectFrozen(t, "after the storm, every probe off")
	s.finish(t) // wrong=0: no toggle ever showed a thread a torn or wrong instruction
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestSessionInt3: with nop placeholders every command needs the int3
// protocol, hence every thread traced: the first runs outside the batch
// (the session's tracer is upgraded), the rest inside it; each succeeds,
// the workers never compute a wrong value, and the session ends detached.
func TestSessionInt3(t *testing.T) {
	testutil.RequirePtrace(t)
	s := startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "nop", true)
	s.expectFrozen(t, "cold at start")
	ss := startSession(t, s)
	ss.send(t, "enable work", "disable work", "enable leaf", "stats")
	for i, want := range []int{2, 2, 2} {
		if l := ss.read(t); !l.OK || l.Changed != want {
			t.Fatalf("command %d: %+v (stderr %q)", i+1, l, ss.stderr.String())
		}
	}
	if l := ss.read(t); l.Toggles == nil || *l.Toggles != 6 || *l.Errors != 0 {
		t.Fatalf("stats: %+v", l)
	}
	s.expectMoving(t, "leaf on through int3, from the session", true, true)
	ss.send(t, "disable *")
	if l := ss.read(t); !l.OK || l.Changed != 2 {
		t.Fatalf("disable *: %+v", l)
	}
	ss.in.Close()
	ss.wait(t)
	if tp := tracerOf(s.Pid); tp != 0 {
		t.Fatalf("after the session, TracerPid is %d", tp)
	}
	s.expectFrozen(t, "every probe off after the session")
	s.finish(t)
}

// TestSessionTargetExits: when the process dies, the next command's result
// says so (exit 4) and the session ends with hotpatch's exit status 4.
func TestSessionTargetExits(t *testing.T) {
	testutil.RequirePtrace(t)
	s := startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "flip", true)
	ss := startSession(t, s)
	ss.send(t, "enable leaf")
	if l := ss.read(t); !l.OK {
		t.Fatalf("enable leaf: %+v", l)
	}
	if err := s.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	s.Wait()
	ss.send(t, "disable leaf", "stats")
	if l := ss.read(t); l.OK || l.Exit != 4 || l.Line != 2 {
		t.Fatalf("a command after the target died: %+v, want exit 4", l)
	}
	rest, _ := io.ReadAll(ss.out)
	err := ss.cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 4 || len(rest) > 0 {
		t.Fatalf("session: %v, then %q (stderr %q); want exit 4 and nothing more", err, rest, ss.stderr.String())
	}
}

// TestSessionLazyRuntime: a session on a program started without the
// runtime (glibc's empty hooks) loads it only at its first enable: disables
// before it leave the process as it was; the enable loads it under the
// session's own attach, and its probes record. With --no-inject that enable
// fails with its own result line and the session goes on.
func TestSessionLazyRuntime(t *testing.T) {
	testutil.RequirePtrace(t)
	lib := testutil.Runtime(t, "gcc")
	t.Setenv(EnvRuntime, lib)
	fx := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"mt.c"}})
	mapsRuntime := func(pid int) bool {
		p, err := inject.Inspect(pid)
		if err != nil {
			t.Fatal(err)
		}
		return p.Runtime != nil
	}
	for _, noInject := range []bool{false, true} {
		t.Run(fmt.Sprintf("no-inject=%v", noInject), func(t *testing.T) {
			p := testutil.Start(t, nil, fx.Path)
			progress := p.Symbol(fx.Path, "progress")
			s := &subject{Process: p}
			var args []string
			if noInject {
				args = append(args, "--no-inject")
			}
			ss := startSession(t, s, args...)
			ss.send(t, "disable *", "disable work")
			for i := 1; i <= 2; i++ {
				if l := ss.read(t); !l.OK || l.Line != i {
					t.Fatalf("line %d: %+v (stderr %q)", i, l, ss.stderr.String())
				}
			}
			if mapsRuntime(p.Pid) {
				t.Fatal("the runtime was loaded by a session that had only disabled")
			}
			ss.send(t, "enable work", "disable *")
			l := ss.read(t)
			if noInject {
				if l.OK || l.Exit == 0 || !strings.Contains(l.Error, "--no-inject") {
					t.Fatalf("enable under --no-inject: %+v", l)
				}
			} else if !l.OK || l.Changed == 0 {
				t.Fatalf("enable work: %+v (stderr %q)", l, ss.stderr.String())
			}
			if l := ss.read(t); !l.OK {
				t.Fatalf("disable * after the enable: %+v", l)
			}
			if got := mapsRuntime(p.Pid); got == noInject {
				t.Fatalf("runtime mapped after the enable: %v, want %v (stderr %q)", got, !noInject, ss.stderr.String())
			}
			if !noInject {
				// It records: enable again and wait for work's calls to show.
				ss.send(t, "enable work")
				if l := ss.read(t); !l.OK {
					t.Fatalf("enable work again: %+v", l)
				}
				p.AwaitProgress(progress, 20000)
				r, err := shm.OpenPID(p.Pid)
				if err != nil {
					t.Fatalf("the runtime's region: %v", err)
				}
				n := len(r.Functions())
				r.Close()
				if n == 0 {
					t.Fatal("the loaded runtime recorded no function")
				}
			}
			ss.in.Close()
			ss.wait(t)
			if tp := tracerOf(p.Pid); tp != 0 {
				t.Fatalf("after the session, TracerPid is %d", tp)
			}
			p.Finish()
		})
	}
}
