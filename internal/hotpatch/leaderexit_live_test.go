package hotpatch

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestLeaderExited: a process whose main thread called pthread_exit runs
// on in its other threads. hotpatch works on it (D95): the lock is a flock
// of its /proc/PID/fd and the seize of a live thread, and the memory is
// reached through that thread. Each step of the fixture calls work()
// exactly 1000 times, so the counting hooks' totals at exit say exactly
// which steps ran with work's probes on: steps 2 and 4 of 5, through a
// one-shot toggle with the list, one without it, and a session, by flip
// and by int3.
func TestLeaderExited(t *testing.T) {
	testutil.RequirePtrace(t)
	hooks := hooksLib(t)
	rt := testutil.Runtime(t, "gcc")
	for _, c := range []struct {
		spec    testutil.Spec
		runtime bool
	}{
		{testutil.Spec{Compiler: "gcc", Opt: "-O0"}, false},
		{testutil.Spec{Compiler: "clang", Opt: "-O2"}, true},
		{testutil.Spec{Compiler: "gcc", Opt: "-O2", PIE: testutil.Bool(false)}, true},
		{testutil.Spec{Compiler: "clang", Opt: "-O0"}, false},
	} {
		name := c.spec.String() + map[bool]string{false: "-hooks", true: "-runtime"}[c.runtime]
		t.Run(name, func(t *testing.T) {
			fix, list := leaderFixture(t, c.spec)
			preload := hooks
			if c.runtime {
				preload += ":" + rt
			}
			for _, proto := range []string{ProtoFlip, ProtoInt3} {
				t.Run(proto, func(t *testing.T) {
					p := testutil.Start(t, []string{"LD_PRELOAD=" + preload}, fix.Path, "steps")
					awaitLeaderExited(t, p.Pid)
					pid := fmt.Sprint(p.Pid)
					step := 0
					next := func() {
						t.Helper()
						step++
						leaderStep(t, p, step)
					}
					toggle := func(args ...string) {
						t.Helper()
						r := command(t, "hotpatch", append([]string{"--pid", pid, "--protocol", proto, "--json"}, args...)...)
						var res Result
						if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &res) != nil || !res.OK || res.Changed != 2 || res.PID != p.Pid {
							t.Fatalf("hotpatch %s: exit %d, stdout %q, stderr %q; want 2 sites changed in pid %d", strings.Join(args, " "), r.Code, r.Stdout, r.Stderr, p.Pid)
						}
					}
					next() // off
					toggle("--probes", list, "--enable", "work")
					next() // on
					toggle("--disable", "work")
					next() // off
					ss := startSession(t, &subject{Process: p, probeArgs: []string{"--probes", list}}, "--protocol", proto)
					ss.send(t, "enable work")
					if l := ss.read(t); !l.OK || l.Changed != 2 {
						t.Fatalf("session enable: %+v", l)
					}
					next() // on
					ss.send(t, "disable work")
					if l := ss.read(t); !l.OK || l.Changed != 2 {
						t.Fatalf("session disable: %+v", l)
					}
					ss.in.Close()
					ss.wait(t)
					next() // off
					for _, st := range listStates(t, pid, list) {
						if st.State != "off" {
							t.Errorf("probe %d (%s %s) is %s after the last disable", st.ID, st.Kind, st.Function, st.State)
						}
					}
					leaderFinish(t, p, 2000) // steps 2 and 4 of 5 on
				})
			}
		})
	}
}

// listStates is `hotpatch list --json` of pid with list.
func listStates(t *testing.T, pid, list string) []ProbeState {
	t.Helper()
	r := hotpatchOK(t, "list", "--pid", pid, "--probes", list, "--json")
	var st []ProbeState
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatalf("list --json: %v\n%s", err, r.Stdout)
	}
	return st
}

// TestLeaderExitsMidSession: the main thread exits while a session holds
// the process (it seized the main thread before). The session goes on
// working, by flip and by int3: its memory file keeps the address space,
// and an int3 command seizes the threads that run on and leaves the exited
// main thread alone (a zombie never stops; it stays traced by the session
// until the session ends: D95). Until then a second hotpatch, which finds
// the main thread exited and takes the flock, is told the session holds
// the process. The process runs on with whole sites.
func TestLeaderExitsMidSession(t *testing.T) {
	testutil.RequirePtrace(t)
	hooks := hooksLib(t)
	fix, list := leaderFixture(t, testutil.Spec{})
	for _, proto := range []string{ProtoAuto, ProtoInt3} {
		t.Run(proto, func(t *testing.T) {
			p := testutil.Start(t, []string{"LD_PRELOAD=" + hooks}, fix.Path, "late")
			ss := startSession(t, &subject{Process: p, probeArgs: []string{"--probes", list}}, "--protocol", proto)
			ss.send(t, "enable work")
			if l := ss.read(t); !l.OK || l.Changed != 2 {
				t.Fatalf("enable before the main thread exits: %+v", l)
			}
			if err := os.WriteFile(p.StopFile+".go", nil, 0o644); err != nil {
				t.Fatal(err)
			}
			awaitLeaderExited(t, p.Pid)
			r := command(t, "hotpatch", "--pid", fmt.Sprint(p.Pid), "--probes", list, "--disable", "work")
			if r.Code != 1 || strings.Count(r.Stderr, "\n") != 1 || !strings.Contains(r.Stderr, "(hotpatch)") || !strings.Contains(r.Stderr, "--wait") {
				t.Errorf("a second hotpatch while the session holds the exited main thread: exit %d, stderr %q; want one line, exit 1, naming the session as the holder", r.Code, r.Stderr)
			}
			ss.send(t, "disable work")
			if l := ss.read(t); !l.OK || l.Changed != 2 {
				t.Errorf("%s disable after the main thread exited: %+v", proto, l)
			}
			ss.send(t, "enable work")
			if l := ss.read(t); !l.OK || l.Changed != 2 {
				t.Errorf("%s enable after the main thread exited: %+v", proto, l)
			}
			ss.send(t, "stats")
			if l := ss.read(t); !l.OK || l.Command != "stats" {
				t.Errorf("stats after: %+v (the session must go on)", l)
			}
			ss.in.Close()
			ss.wait(t)
			hotpatchOK(t, "--pid", fmt.Sprint(p.Pid), "--probes", list, "--disable", "work")
			for _, st := range listStates(t, fmt.Sprint(p.Pid), list) {
				if st.State != "off" {
					t.Errorf("probe %d (%s %s) is %s", st.ID, st.Kind, st.Function, st.State)
				}
			}
			if out, _ := p.Finish(); !strings.HasPrefix(out, "done 1") {
				t.Fatalf("leaderexit: %q", out)
			}
		})
	}
}

// awaitLeaderExited polls until pid's main thread is a zombie with the
// process running on, failing after a minute. (The process's memory is
// not readable through the exited thread, so its progress counter cannot
// be the handshake.)
// leaderFixture builds leaderexit.c with spec (its sources set here) and
// writes its probe list next to it.
func leaderFixture(t *testing.T, spec testutil.Spec) (testutil.Fixture, string) {
	t.Helper()
	spec.Sources = []string{"leaderexit.c"}
	fix := testutil.Build(t, spec)
	return fix, testutil.ProbeList(t, filepath.Join(filepath.Dir(fix.Path), "leaderexit.json"), fix.Path)
}

// leaderStep runs step n of leaderexit.c's "steps" mode: the step file,
// then the fixture's "step n" line once its 1000 work() calls are made.
func leaderStep(t *testing.T, p *testutil.Process, n int) {
	t.Helper()
	if err := os.WriteFile(fmt.Sprintf("%s.%d", p.StopFile, n), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if l := p.Line(); l != fmt.Sprintf("step %d", n) {
		t.Fatalf("step %d: %q", n, l)
	}
}

// leaderFinish ends the fixture and checks the counting hooks saw calls
// entries and exits of work().
func leaderFinish(t *testing.T, p *testutil.Process, calls int) {
	t.Helper()
	out, errOut := p.Finish()
	if want := fmt.Sprintf("hooks enters=%d exits=%d", calls, calls); !strings.HasPrefix(out, "done 1") || !strings.Contains(errOut, want) {
		t.Fatalf("leaderexit: stdout %q, stderr %q; want %s", out, errOut, want)
	}
}

func awaitLeaderExited(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !procfs.LeaderExited(pid); runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d: the main thread did not exit within a minute", pid)
		}
	}
}

// TestLeaderExitedKilledMidPatch: hotpatch is SIGKILLed in an int3
// protocol's first wait on a process whose main thread has exited, with
// the runtime loaded. Its SIGTRAP handler must repair in-process (through
// its own thread's mem file: the main thread's reaches nothing), but not
// while another hotpatch holds the process: a session opened after the
// kill holds the lock (the flock, D95) and the seize of the idle thread, so
// the thread that meets the int3 is traced by nobody and the exited main
// thread shows no tracer; the handler must see the flock and wait. Once
// the session ends, it repairs, and work() ran exactly its 1000 calls with
// its probes on. With EDGEPROBE_TRAP_REPAIR=0 the handler holds the thread
// until `hotpatch repair` makes the sites whole from outside.
func TestLeaderExitedKilledMidPatch(t *testing.T) {
	testutil.RequirePtrace(t)
	hooks := hooksLib(t)
	rt := testutil.Runtime(t, "gcc")
	fix, list := leaderFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	for _, mode := range []string{"alone", "session-holds", "outside-repair"} {
		t.Run(mode, func(t *testing.T) {
			held := mode == "session-holds"
			env := []string{"LD_PRELOAD=" + hooks + ":" + rt}
			if mode == "outside-repair" {
				env = append(env, "EDGEPROBE_TRAP_REPAIR=0")
			}
			p := testutil.Start(t, env, fix.Path, "steps")
			awaitLeaderExited(t, p.Pid)
			s := &subject{Process: p, probeArgs: []string{"--probes", list}}
			killMidPatch(t, s)
			var ss *session
			if held {
				ss = startSession(t, s)
				ss.send(t, "stats")
				if l := ss.read(t); !l.OK {
					t.Fatalf("session: %+v", l)
				}
			}
			if err := os.WriteFile(p.StopFile+".1", nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if mode != "alone" {
				awaitHeldUnrepaired(t, s, "a session")
				torn := 0
				for _, st := range listStates(t, fmt.Sprint(p.Pid), list) {
					if st.State == stateTorn {
						torn++
					}
				}
				if torn == 0 {
					t.Fatal("no site is mid-patch while the handler holds a thread")
				}
				if held {
					ss.in.Close()
					ss.wait(t)
				} else {
					r := command(t, "hotpatch", "repair", "--pid", fmt.Sprint(p.Pid), "--probes", list)
					if r.Code != 0 || strings.Count(r.Stdout, "repaired ") != torn {
						t.Fatalf("repair of %d mid-patch site(s): exit %d, stdout %q, stderr %q", torn, r.Code, r.Stdout, r.Stderr)
					}
				}
			}
			if l := p.Line(); l != "step 1" {
				t.Fatalf("step 1: %q", l)
			}
			traps, repairs, holds := inflightCounters(t, s)
			t.Logf("handler took %d traps, repaired %d sites, held %d", traps, repairs, holds)
			if mode == "outside-repair" {
				if traps == 0 || repairs != 0 {
					t.Fatalf("traps %d, repairs %d: with EDGEPROBE_TRAP_REPAIR=0 the handler takes the trap and repairs nothing", traps, repairs)
				}
			} else if traps == 0 || repairs == 0 {
				t.Fatalf("traps %d, repairs %d: the handler must have taken the trap and repaired", traps, repairs)
			}
			for _, st := range listStates(t, fmt.Sprint(p.Pid), list) {
				if st.State != "on" && st.State != "off" {
					t.Fatalf("probe %d (%s %s) left %s: %s", st.ID, st.Kind, st.Function, st.State, st.Bytes)
				}
			}
			hotpatchOK(t, "--pid", fmt.Sprint(p.Pid), "--probes", list, "--enable", "work")
			out, errOut := p.Finish()
			if !strings.HasPrefix(out, "done 1") {
				t.Fatalf("leaderexit: stdout %q, stderr %q", out, errOut)
			}
		})
	}
}

// TestLeaderExitedCaptures: stats, top, trace and profile work on a
// process whose main thread has exited (D95): they read the runtime's
// region and the process's maps through a live thread, and take it for
// alive while its other threads run. After work's probes were enabled and
// one step ran, stats counts exactly that step's 1000 calls; a trace of
// the next step, limited to 1000 calls, ends with exactly those; top and
// profile end normally; every probe is off after them.
func TestLeaderExitedCaptures(t *testing.T) {
	testutil.RequirePtrace(t)
	fix, list := leaderFixture(t, testutil.Spec{})
	p := testutil.Start(t, []string{"LD_PRELOAD=" + testutil.Runtime(t, "gcc")}, fix.Path, "steps")
	awaitLeaderExited(t, p.Pid)
	pid := fmt.Sprint(p.Pid)
	step := func(n int) {
		t.Helper()
		if err := os.WriteFile(fmt.Sprintf("%s.%d", p.StopFile, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if l := p.Line(); l != fmt.Sprintf("step %d", n) {
			t.Fatalf("step %d: %q", n, l)
		}
	}
	workState := func() string {
		t.Helper()
		for _, st := range listStates(t, pid, list) {
			if st.Function == "work" {
				return st.State
			}
		}
		t.Fatal("the list has no work")
		return ""
	}
	hotpatchOK(t, "--pid", pid, "--probes", list, "--enable", "work")
	step(1)
	hotpatchOK(t, "--pid", pid, "--probes", list, "--disable", "work")
	r := hotpatchOK(t, "stats", "--pid", pid, "--probes", list, "--json")
	var st struct {
		Functions []struct {
			Name           string
			Entries, Exits uint64
		}
	}
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatalf("stats --json: %v: %q", err, r.Stdout)
	}
	found := false
	for _, f := range st.Functions {
		if f.Name == "work" {
			found = true
			if f.Entries != 1000 || f.Exits != 1000 {
				t.Errorf("stats: work entered %d, exited %d times; want the step's 1000", f.Entries, f.Exits)
			}
		}
	}
	if !found {
		t.Errorf("stats names no work: %q", r.Stdout)
	}

	out := filepath.Join(t.TempDir(), "trace.txt")
	tr := exec.Command(testutil.Command(t, "hotpatch"), "trace", "--pid", pid, "--probes", list, "--enable", "work",
		"--duration", "60s", "--max-calls", "1000", "--ring-events", "4096", "--format", "text", "-o", out)
	var trErr strings.Builder
	tr.Stdout, tr.Stderr = &trErr, &trErr // the summary goes to stdout with -o
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- tr.Wait() }()
	for deadline := time.Now().Add(time.Minute); workState() != "on"; {
		select {
		case err := <-done:
			t.Fatalf("trace ended before it enabled work: %v: %s", err, trErr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("trace did not enable work within a minute")
		}
	}
	step(2)
	if err := <-done; err != nil {
		t.Fatalf("trace: %v: %s", err, trErr.String())
	}
	if !strings.Contains(trErr.String(), "stopped early at --max-calls 1000") || !strings.Contains(trErr.String(), ": 1000 calls") {
		t.Errorf("trace of a 1000-call step: %q", trErr.String())
	}
	if r := hotpatchOK(t, "top", "--pid", pid, "--count", "1", "--interval", "100ms", "--json"); !strings.Contains(r.Stdout, fmt.Sprintf(`"pid":%d`, p.Pid)) {
		t.Errorf("top: %q", r.Stdout)
	}
	hotpatchOK(t, "profile", "--pid", pid, "--probes", list, "--enable", "work", "--duration", "300ms", "-o", filepath.Join(t.TempDir(), "profile.json"))
	for _, st := range listStates(t, pid, list) {
		if st.State != "off" {
			t.Errorf("probe %d (%s %s) is %s after the captures", st.ID, st.Kind, st.Function, st.State)
		}
	}
	if o, _ := p.Finish(); !strings.HasPrefix(o, "done 1") {
		t.Fatalf("leaderexit: %q", o)
	}
}

// TestLeaderExitedLockRace: hotpatches on a process whose main thread has
// exited exclude each other through the flock (D95). A session holds it:
// a one-shot toggle fails in one line naming the session, having written
// nothing; one with --wait waits until the session ends and then writes.
// Eight one-shot enables of the same probes started at once with --wait:
// each must find the sites as the one before left them, so exactly one
// reports changing them (two at once would both see them off).
func TestLeaderExitedLockRace(t *testing.T) {
	testutil.RequirePtrace(t)
	fix, list := leaderFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	p := testutil.Start(t, []string{"LD_PRELOAD=" + hooksLib(t)}, fix.Path, "steps")
	awaitLeaderExited(t, p.Pid)
	pid := fmt.Sprint(p.Pid)
	state := func() string {
		t.Helper()
		var on, off int
		for _, st := range listStates(t, pid, list) {
			if st.Function == "work" && st.State == "on" {
				on++
			} else if st.Function == "work" && st.State == "off" {
				off++
			}
		}
		return fmt.Sprintf("%d on, %d off", on, off)
	}
	ss := startSession(t, &subject{Process: p, probeArgs: []string{"--probes", list}})
	ss.send(t, "enable work")
	if l := ss.read(t); !l.OK || l.Changed != 2 {
		t.Fatalf("session enable: %+v", l)
	}
	r := command(t, "hotpatch", "--pid", pid, "--probes", list, "--disable", "work")
	if r.Code != 1 || strings.Count(r.Stderr, "\n") != 1 || !strings.Contains(r.Stderr, "(hotpatch)") || !strings.Contains(r.Stderr, "--wait") {
		t.Errorf("a toggle while a session holds the process: exit %d, stderr %q; want exit 1, one line naming the session", r.Code, r.Stderr)
	}
	if s := state(); s != "2 on, 0 off" {
		t.Fatalf("after the refused toggle: %s; want the session's 2 on", s)
	}
	waiter := exec.Command(testutil.Command(t, "hotpatch"), "--pid", pid, "--probes", list, "--wait", "--disable", "work", "--json")
	var wout strings.Builder
	waiter.Stdout = &wout
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- waiter.Wait() }()
	ss.send(t, "stats") // a round trip while the waiter waits: still ours
	if l := ss.read(t); !l.OK {
		t.Fatalf("session stats: %+v", l)
	}
	select {
	case err := <-done:
		t.Fatalf("the --wait toggle ended (%v, %q) while the session held the process", err, wout.String())
	default:
	}
	if s := state(); s != "2 on, 0 off" {
		t.Fatalf("while the --wait toggle waits: %s; want the session's 2 on", s)
	}
	ss.in.Close()
	ss.wait(t)
	if err := <-done; err != nil {
		t.Fatalf("the --wait toggle: %v", err)
	}
	var res Result
	if err := json.Unmarshal([]byte(wout.String()), &res); err != nil || !res.OK || res.Changed != 2 {
		t.Fatalf("the --wait toggle after the session: %q", wout.String())
	}
	const n = 8
	results := make(chan cmdResult, n)
	for i := 0; i < n; i++ {
		go func() {
			results <- testutil.Run(t, "hotpatch", "--pid", pid, "--probes", list, "--wait", "--enable", "work", "--json")
		}()
	}
	changed := 0
	for i := 0; i < n; i++ {
		r := <-results
		var res Result
		if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &res) != nil || !res.OK {
			t.Fatalf("a racing enable: exit %d, stdout %q, stderr %q", r.Code, r.Stdout, r.Stderr)
		}
		if res.Changed != 0 {
			changed++
			if res.Changed != 2 {
				t.Errorf("a racing enable changed %d sites", res.Changed)
			}
		}
	}
	if changed != 1 {
		t.Errorf("%d of %d racing enables changed the sites; exactly one may", changed, n)
	}
	if s := state(); s != "2 on, 0 off" {
		t.Errorf("after the racing enables: %s", s)
	}
	leaderStep(t, p, 1)
	leaderFinish(t, p, 1000)
}

// TestLeaderExitedOtherUser: the lock of a process whose main thread has
// exited is a flock of its /proc/PID/fd (D95), which only the process's
// owner and root may open: a second local user can neither take it nor
// hold it against root (flock(1) as that user fails to open it), and
// root's toggle right after works.
func TestLeaderExitedOtherUser(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireTool(t, "flock")
	other := testutil.OtherUser(t)
	fix, list := leaderFixture(t, testutil.Spec{})
	p := testutil.Start(t, []string{"LD_PRELOAD=" + hooksLib(t)}, fix.Path, "steps")
	awaitLeaderExited(t, p.Pid)
	fd := fmt.Sprintf("/proc/%d/fd", p.Pid)
	out, err := other.Command("flock", "--nonblock", "--conflict-exit-code", "7", fd, "true").CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() == 0 || ee.ExitCode() == 7 || !strings.Contains(string(out), "ermission denied") {
		t.Fatalf("flock of %s as %s: %v, %q; want it refused for permission", fd, other.Name, err, out)
	}
	var res Result
	r := command(t, "hotpatch", "--pid", fmt.Sprint(p.Pid), "--probes", list, "--enable", "work", "--json")
	if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &res) != nil || res.Changed != 2 {
		t.Fatalf("root's toggle: exit %d, stdout %q, stderr %q", r.Code, r.Stdout, r.Stderr)
	}
	if o, _ := p.Finish(); !strings.HasPrefix(o, "done") {
		t.Fatalf("leaderexit: %q", o)
	}
}

// TestLeaderExitedAnchorExits: the thread a session reaches a process
// through (its main thread having exited) exits while the session holds
// it. A flip session takes another thread under the lock it still holds
// and goes on; an int3 session (its tracer holds every thread) says so in
// one line (exit 1, not "the process exited", exit 4), having written
// nothing, and a new hotpatch takes another thread and works.
func TestLeaderExitedAnchorExits(t *testing.T) {
	testutil.RequirePtrace(t)
	fix, list := leaderFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	hooks := hooksLib(t)
	for _, proto := range []string{ProtoAuto, ProtoInt3} {
		t.Run(proto, func(t *testing.T) {
			p := testutil.Start(t, []string{"LD_PRELOAD=" + hooks}, fix.Path, "steps")
			awaitLeaderExited(t, p.Pid)
			ss := startSession(t, &subject{Process: p, probeArgs: []string{"--probes", list}}, "--protocol", proto)
			for _, c := range []string{"enable work", "disable work"} {
				ss.send(t, c)
				if l := ss.read(t); !l.OK || l.Changed != 2 {
					t.Fatalf("%s: %+v", c, l)
				}
			}
			if err := os.WriteFile(p.StopFile+".idle", nil, 0o644); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(time.Minute); ; runtime.Gosched() {
				ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", p.Pid))
				if len(ents) == 2 { // the exited main thread and the worker
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the idle thread did not exit within a minute")
				}
			}
			ss.send(t, "enable work")
			l := ss.read(t)
			if proto == ProtoAuto {
				if !l.OK || l.Changed != 2 {
					t.Fatalf("flip enable after the session's thread exited: %+v; want it to go on through another", l)
				}
			} else {
				if l.OK || l.Exit != 1 || !strings.Contains(l.Error, "main thread has exited") || !strings.Contains(l.Error, "run the command again") {
					t.Errorf("int3 enable after the session's thread exited: %+v; want exit 1 saying so", l)
				}
				for _, st := range listStates(t, fmt.Sprint(p.Pid), list) {
					if st.State != "off" {
						t.Fatalf("probe %d (%s %s) is %s: the failed command wrote", st.ID, st.Kind, st.Function, st.State)
					}
				}
			}
			ss.in.Close()
			ss.cmd.Wait() // its exit status counts the failed command, if any
			if proto != ProtoAuto {
				hotpatchOK(t, "--pid", fmt.Sprint(p.Pid), "--probes", list, "--enable", "work")
			}
			leaderStep(t, p, 1)
			leaderFinish(t, p, 1000)
		})
	}
}

// TestLeaderExitedExec: after its main thread has exited, a worker thread
// calls exec while a session holds the process (the kernel kills the other
// threads, the thread the session works through among them, and the
// execing thread takes over the pid), by flip and by int3. The session
// writes nothing into the new program: its next command fails saying the program ran exec (exit
// 4, as for an exec by the main thread), and the new image's probes are
// as it started them. A hotpatch after that works on the new program.
func TestLeaderExitedExec(t *testing.T) {
	testutil.RequirePtrace(t)
	hooks := hooksLib(t)
	fix, list := leaderFixture(t, testutil.Spec{Compiler: "clang", Opt: "-O2"})
	for _, proto := range []string{ProtoAuto, ProtoInt3} {
		t.Run(proto, func(t *testing.T) {
			stop2 := filepath.Join(t.TempDir(), "stop2")
			p := testutil.Start(t, []string{"LD_PRELOAD=" + hooks}, fix.Path, "exec", fix.Path, stop2)
			awaitLeaderExited(t, p.Pid)
			s := &subject{Process: p, probeArgs: []string{"--probes", list}}
			ss := startSession(t, s, "--protocol", proto)
			ss.send(t, "enable work")
			if l := ss.read(t); !l.OK || l.Changed != 2 {
				t.Fatalf("enable work: %+v", l)
			}
			if err := os.WriteFile(p.StopFile+".1", nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if l := p.Line(); l != fmt.Sprintf("ready %d", p.Pid) {
				t.Fatalf("the new image's ready line: %q", l)
			}
			ss.send(t, "disable work")
			l := ss.read(t)
			if l.OK || l.Exit != 4 || !strings.Contains(l.Error, "ran exec") {
				t.Fatalf("the command after the exec: %+v; want exit 4 saying the program ran exec", l)
			}
			err := ss.cmd.Wait()
			if ee, ok := err.(interface{ ExitCode() int }); !ok || ee.ExitCode() != 4 {
				t.Fatalf("session: %v (stderr %q), want exit status 4", err, ss.stderr.String())
			}
			awaitLeaderExited(t, p.Pid) // the new image's main thread exits too
			for _, st := range listStates(t, fmt.Sprint(p.Pid), list) {
				if st.State != "off" {
					t.Errorf("the new image's probe %d (%s %s) is %s", st.ID, st.Kind, st.Function, st.State)
				}
			}
			hotpatchOK(t, "--pid", fmt.Sprint(p.Pid), "--probes", list, "--enable", "work")
			if err := os.WriteFile(stop2, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if out, _ := p.Finish(); !strings.HasPrefix(out, "done 1") {
				t.Fatalf("the new image: %q", out)
			}
		})
	}
}

// TestLeaderExitedLoad: a process whose main thread has exited, started
// without the runtime: --enable loads it (its loader thread dlopens the
// memfd through /proc/thread-self/fd: /proc/self/fd is the exited main
// thread's, empty), stats then counts exactly the 1000 calls of the step
// run with work's probes on, and the file the runtime writes at exit
// (EDGEPROBE_OUTPUT, with the maps read through /proc/thread-self: the
// main thread's read empty) names work with the same 1000 calls.
func TestLeaderExitedLoad(t *testing.T) {
	testutil.RequirePtrace(t)
	t.Setenv(EnvRuntime, testutil.Runtime(t, "gcc"))
	fix, list := leaderFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	output := filepath.Join(t.TempDir(), "out.edgeprobe")
	p := testutil.Start(t, []string{"EDGEPROBE_OUTPUT=" + output}, fix.Path, "steps")
	awaitLeaderExited(t, p.Pid)
	pid := fmt.Sprint(p.Pid)
	r := hotpatchOK(t, "--pid", pid, "--probes", list, "--enable", "work")
	if !strings.Contains(r.Stderr, "loaded the edgeprobe runtime") {
		t.Fatalf("--enable: stderr %q; want the runtime loaded", r.Stderr)
	}
	leaderStep(t, p, 1)
	hotpatchOK(t, "--pid", pid, "--probes", list, "--disable", "work")
	workCalls := func(args ...string) {
		t.Helper()
		r := hotpatchOK(t, append([]string{"stats", "--probes", list, "--json"}, args...)...)
		var st struct {
			Functions []struct {
				Name           string
				Entries, Exits uint64
			}
		}
		if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
			t.Fatalf("stats --json: %v: %q", err, r.Stdout)
		}
		for _, f := range st.Functions {
			if f.Name == "work" {
				if f.Entries != 1000 || f.Exits != 1000 {
					t.Errorf("stats %s: work entered %d, exited %d times; want the step's 1000", strings.Join(args, " "), f.Entries, f.Exits)
				}
				return
			}
		}
		t.Errorf("stats %s names no work: %q", strings.Join(args, " "), r.Stdout)
	}
	workCalls("--pid", pid)
	if o, _ := p.Finish(); !strings.HasPrefix(o, "done 1") {
		t.Fatalf("leaderexit: %q", o)
	}
	workCalls("--input", output)
}
