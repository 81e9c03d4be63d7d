package hotpatch

// Live tests: real multi-threaded fixtures, patched by the real hotpatch
// command run as a separate process, as users run it. (A test process that
// both parents and traces a target would race its own wait4 against the
// tracer's, so the tracer must live in another process anyway.)

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

type cmdResult = testutil.Result

func command(t *testing.T, name string, args ...string) cmdResult {
	t.Helper()
	return testutil.Run(t, name, args...)
}

// hotpatchOK runs hotpatch and fails the test unless it exits 0.
func hotpatchOK(t *testing.T, args ...string) cmdResult {
	t.Helper()
	return testutil.RunOK(t, "hotpatch", args...)
}

// subject is a running fixture and where its counters live.
type subject struct {
	*testutil.Process
	enters, exits, progress uint64 // run-time addresses of the counters
	probeArgs               []string
}

func (s *subject) counts() (uint64, uint64) { return s.Read64(s.enters), s.Read64(s.exits) }

// settle lets the workers run for n iterations so that calls in flight when
// a patch landed have finished, and returns the hook counts afterwards.
func (s *subject) settle(n uint64) (uint64, uint64) {
	s.AwaitProgress(s.progress, n)
	return s.counts()
}

// expectFrozen asserts no hook runs while the workers make progress. The
// progress counter is shared by the workers, so one worker descheduled
// inside a hook (a call that entered before the probes went off; a loaded
// machine can hold it for many milliseconds) may finish it during the first
// window: at most one count per worker is allowed there, and then a second
// window must show none at all.
func (s *subject) expectFrozen(t *testing.T, what string) {
	t.Helper()
	const workers = 4 // NTHREADS in mt.c
	e0, x0 := s.settle(2000)
	e1, x1 := s.settle(20000)
	if e1 == e0 && x1 == x0 {
		return
	}
	if e1-e0 <= workers && x1-x0 <= workers {
		e2, x2 := s.settle(20000)
		if e2 == e1 && x2 == x1 {
			return
		}
		e0, x0, e1, x1 = e1, x1, e2, x2
	}
	t.Fatalf("%s: hooks ran while they should be off: enters %d->%d, exits %d->%d", what, e0, e1, x0, x1)
}

// expectMoving asserts the selected hooks run and the others do not.
func (s *subject) expectMoving(t *testing.T, what string, enters, exits bool) {
	t.Helper()
	e0, x0 := s.settle(2000)
	e1, x1 := s.settle(20000)
	if (e1 > e0) != enters || (x1 > x0) != exits {
		t.Fatalf("%s: enters %d->%d (want moving=%v), exits %d->%d (want moving=%v)", what, e0, e1, enters, x0, x1, exits)
	}
}

func (s *subject) hotpatch(t *testing.T, args ...string) cmdResult {
	t.Helper()
	return hotpatchOK(t, append([]string{"--pid", fmt.Sprint(s.Pid)}, append(s.probeArgs, args...)...)...)
}

func (s *subject) states(t *testing.T) []ProbeState {
	t.Helper()
	r := s.hotpatch(t, "list", "--json")
	var st []ProbeState
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatalf("list --json: %v\n%s", err, r.Stdout)
	}
	return st
}

func (s *subject) finish(t *testing.T) {
	t.Helper()
	out, _ := s.Finish()
	if !strings.Contains(out, "wrong=0") {
		t.Fatalf("the program computed wrong results under patching: %q", out)
	}
}

func hooksLib(t *testing.T) string {
	t.Helper()
	return testutil.Build(t, testutil.Spec{Sources: []string{"hooks.c"}, Shared: true, NoInstr: true, Name: "libhooks.so"}).Path
}

// startMT builds mt.c per spec, optionally coldpatches it, and starts it with
// counting hooks (preloaded, or linked in for static builds).
func startMT(t *testing.T, spec testutil.Spec, cold string, useList bool) *subject {
	t.Helper()
	return startMTEnv(t, spec, cold, useList, "", nil)
}

// startMTEnv is startMT with more libraries preloaded after the counting
// hooks (the runtime, whose hooks the counting ones then shadow: its
// constructor and SIGTRAP handler run, the counts stay the fixture's).
func startMTEnv(t *testing.T, spec testutil.Spec, cold string, useList bool, preload string, extra []string) *subject {
	t.Helper()
	spec.Sources = []string{"mt.c"}
	hooksAt := ""
	var env []string
	if spec.Static {
		spec.Sources = append(spec.Sources, "hooks.c")
	} else {
		hooksAt = hooksLib(t)
		env = []string{"LD_PRELOAD=" + strings.TrimSuffix(hooksAt+":"+preload, ":")}
	}
	env = append(env, extra...)
	fx := testutil.Build(t, spec)
	if hooksAt == "" {
		hooksAt = fx.Path
	}
	s := &subject{}
	if cold != "" {
		r := command(t, "coldpatch", "--placeholder", cold, fx.Path)
		if r.Code != 0 {
			t.Fatalf("coldpatch: %s", r.Stderr)
		}
		if useList {
			list := filepath.Join(t.TempDir(), "probes.json")
			os.WriteFile(list, []byte(r.Stdout), 0o644)
			s.probeArgs = []string{"--probes", list}
		}
	}
	s.Process = testutil.Start(t, env, fx.Path)
	s.enters = s.Symbol(hooksAt, "enters")
	s.exits = s.Symbol(hooksAt, "exits")
	s.progress = s.Symbol(fx.Path, "progress")
	return s
}

func TestEnableDisable(t *testing.T) {
	testutil.RequirePtrace(t)
	cases := []struct {
		spec    testutil.Spec
		cold    string
		useList bool
	}{
		{testutil.Spec{Compiler: "gcc", Opt: "-O2", PIE: testutil.Bool(true)}, "", false},
		{testutil.Spec{Compiler: "clang", Opt: "-O2", PIE: testutil.Bool(true)}, "flip", true},
		{testutil.Spec{Compiler: "gcc", Opt: "-O0", PIE: testutil.Bool(false)}, "flip", false},
		{testutil.Spec{Compiler: "clang", Opt: "-O3", PIE: testutil.Bool(true), NoPLT: true}, "", false},
		{testutil.Spec{Compiler: "gcc", Opt: "-O2", Static: true, PIE: testutil.Bool(false)}, "flip", true},
	}
	for _, c := range cases {
		name := c.spec.String() + "-" + map[string]string{"": "nevercold", "flip": "cold"}[c.cold]
		if c.useList {
			name += "-list"
		}
		t.Run(name, func(t *testing.T) {
			s := startMT(t, c.spec, c.cold, c.useList)
			if c.cold == "" {
				s.expectMoving(t, "never-cold binary at start", true, true)
				s.hotpatch(t, "--disable", "*")
			}
			s.expectFrozen(t, "all probes off")
			s.hotpatch(t, "--enable", "work", "--kind", "entry")
			s.expectMoving(t, "work's entry on", true, false)
			s.hotpatch(t, "--enable", "leaf")
			s.expectMoving(t, "leaf's entry and exit on", true, true)
			for _, st := range s.states(t) {
				on := st.Function == "leaf" || (st.Function == "work" && st.Kind == probelist.KindEntry)
				if (st.State == "on") != on || (st.State != "on" && st.State != "off") {
					t.Errorf("probe %d (%s %s) is %s", st.ID, st.Kind, st.Function, st.State)
				}
			}
			// Order matters: the later --disable wins for leaf.
			s.hotpatch(t, "--enable", "*", "--disable", "leaf", "--disable", "work")
			s.hotpatch(t, "--disable", "*")
			s.expectFrozen(t, "all probes off again")
			s.finish(t)
		})
	}
}

func TestSharedLibrary(t *testing.T) {
	testutil.RequirePtrace(t)
	hooks := hooksLib(t)
	lib := testutil.Build(t, testutil.Spec{Sources: []string{"lib.c"}, Shared: true, Name: "libfix.so", Flags: []string{"-Wl,-soname,libfix.so"}})
	dir := filepath.Dir(lib.Path)
	list := testutil.ProbeList(t, filepath.Join(dir, "libfix.json"), lib.Path)
	loop := testutil.Build(t, testutil.Spec{Sources: []string{"libloop.c"}, LDFlags: []string{lib.Path, "-Wl,-rpath," + dir}})
	p := testutil.Start(t, []string{"LD_PRELOAD=" + hooks}, loop.Path)
	s := &subject{Process: p, enters: p.Symbol(hooks, "enters"), exits: p.Symbol(hooks, "exits"), progress: p.Symbol(loop.Path, "progress")}

	s.expectFrozen(t, "cold library")
	s.probeArgs = []string{"--probes", list}
	s.hotpatch(t, "--enable", "lib_entry")
	s.expectMoving(t, "lib_entry on through the library's list", true, true)
	s.hotpatch(t, "--disable", "lib_entry")
	s.expectFrozen(t, "lib_entry off")
	s.probeArgs = nil // scan: the executable (never cold) and the library
	s.hotpatch(t, "--enable", "lib_*", "--kind", "exit")
	s.expectMoving(t, "library exits on by scan", false, true)
	s.hotpatch(t, "--disable", "*")
	s.expectFrozen(t, "everything off")
	out, _ := s.Finish()
	if !strings.Contains(out, "done") {
		t.Fatalf("libloop: %q", out)
	}
}

// TestProtocols toggles a nop-placeholder binary (multi-byte sites) and a
// flip one with every protocol, many times, while four threads run the sites.
func TestProtocols(t *testing.T) {
	testutil.RequirePtrace(t)
	for _, c := range []struct{ placeholder, protocol string }{
		{"nop", ProtoInt3}, {"nop", ProtoInt3Async}, {"nop", ProtoStop}, {"nop", ProtoAuto},
		{"flip", ProtoFlip}, {"flip", ProtoStop}, {"flip", ProtoInt3},
	} {
		t.Run(c.placeholder+"-"+c.protocol, func(t *testing.T) {
			s := startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, c.placeholder, true)
			s.expectFrozen(t, "cold")
			s.hotpatch(t, "--protocol", c.protocol, "--enable", "work")
			s.expectMoving(t, "work on", true, true)
			toggles := 20
			if testing.Short() {
				toggles = 4
			}
			for i := 0; i < toggles; i++ {
				s.hotpatch(t, "--protocol", c.protocol, "--enable", "*")
				s.hotpatch(t, "--protocol", c.protocol, "--disable", "*")
			}
			s.expectFrozen(t, "off after toggling")
			if !s.Alive() {
				t.Fatal("target died")
			}
			s.finish(t)
		})
	}
	t.Run("flip-refuses-nop", func(t *testing.T) {
		s := startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "nop", true)
		r := command(t, "hotpatch", append([]string{"--pid", fmt.Sprint(s.Pid), "--protocol", "flip", "--enable", "work"}, s.probeArgs...)...)
		if r.Code != 1 || !strings.Contains(r.Stderr, "more than one byte") {
			t.Fatalf("exit %d, stderr %q", r.Code, r.Stderr)
		}
		s.expectFrozen(t, "refused request")
		s.finish(t)
	})
}

// TestRefusals: stale and foreign probe lists, and a busy lock, change nothing.
func TestRefusals(t *testing.T) {
	testutil.RequirePtrace(t)
	s := startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "flip", false)
	before := s.states(t)
	check := func(what string, r cmdResult, want string) {
		t.Helper()
		if r.Code != 1 || !strings.Contains(r.Stderr, want) || strings.Count(r.Stderr, "\n") != 1 {
			t.Errorf("%s: exit %d, stderr %q; want 1 and one line containing %q", what, r.Code, r.Stderr, want)
		}
		after := s.states(t)
		for i := range after {
			if after[i].State != before[i].State {
				t.Errorf("%s: probe %d changed from %s to %s", what, i, before[i].State, after[i].State)
			}
		}
	}
	pid := fmt.Sprint(s.Pid)

	// A list made for another build of the program.
	other := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O1", Sources: []string{"mt.c"}})
	r := command(t, "coldpatch", "--dry-run", other.Path)
	stale := filepath.Join(t.TempDir(), "stale.json")
	os.WriteFile(stale, []byte(r.Stdout), 0o644)
	check("stale list", command(t, "hotpatch", "--pid", pid, "--probes", stale, "--enable", "*"), "stale probe list")

	// The right build-id, but one site's bytes are not what the process holds.
	l, _, err := scanRunning(s)
	if err != nil {
		t.Fatal(err)
	}
	l.Probes[len(l.Probes)-1].Active[2] ^= 0xff
	l.Probes[len(l.Probes)-1].Inert[2] ^= 0xff
	foreign := filepath.Join(t.TempDir(), "foreign.json")
	if err := l.WriteFile(foreign); err != nil {
		t.Fatal(err)
	}
	check("foreign bytes", command(t, "hotpatch", "--pid", pid, "--probes", foreign, "--enable", "*"), "nothing was written")

	// Another hotpatch at work (an int3 batch in its long first wait): the
	// attach is the lock, so a second one is refused naming the holder, and
	// with --wait it runs once the holder is done.
	holder := exec.Command(testutil.Command(t, "hotpatch"), "--pid", pid, "--protocol", "int3", "--int3-wait", "1s", "--enable", "leaf")
	if err := testutil.StartBound(holder); err != nil {
		t.Fatal(err)
	}
	awaitMidPatch(t, s)
	r = command(t, "hotpatch", "--pid", pid, "--enable", "*")
	if r.Code != 1 || strings.Count(r.Stderr, "\n") != 1 || !strings.Contains(r.Stderr, "another hotpatch") ||
		!strings.Contains(r.Stderr, fmt.Sprintf("pid %d (hotpatch)", holder.Process.Pid)) {
		t.Errorf("busy: exit %d, stderr %q; want 1 and one line naming pid %d (hotpatch)", r.Code, r.Stderr, holder.Process.Pid)
	}
	waiter := exec.Command(testutil.Command(t, "hotpatch"), "--pid", pid, "--wait", "--enable", "work")
	var waiterErr bytes.Buffer
	waiter.Stderr = &waiterErr
	if err := testutil.StartBound(waiter); err != nil {
		t.Fatal(err)
	}
	if err := holder.Wait(); err != nil {
		t.Fatalf("holder: %v", err)
	}
	if err := waiter.Wait(); err != nil {
		t.Fatalf("--wait: %v: %s", err, waiterErr.String())
	}
	s.expectMoving(t, "after --wait", true, true)
	s.finish(t)
}

// scanRunning scans the running executable as hotpatch does.
func scanRunning(s *subject) (*probelist.List, *Target, error) {
	targets, err := LoadTargets(s.Pid, nil)
	if err != nil {
		return nil, nil, err
	}
	for _, t := range targets {
		if strings.Contains(t.Object.Path, "mt-") {
			l, err := t.List.List()
			return l, t, err
		}
	}
	return nil, nil, errors.New("executable not found among targets")
}

// TestInterrupted: SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGPIPE to
// hotpatch, and the target dying, in the middle of an int3 batch. The int3
// wait is long so the test can see the batch in flight (a site holding its
// int3) before it acts.
func TestInterrupted(t *testing.T) {
	testutil.RequirePtrace(t)
	sigs := map[string]syscall.Signal{"sigint": syscall.SIGINT, "sigterm": syscall.SIGTERM, "sighup": syscall.SIGHUP,
		"sigquit": syscall.SIGQUIT, "sigpipe": syscall.SIGPIPE}
	for _, how := range []string{"sigint", "sigterm", "sighup", "sigquit", "sigpipe", "target-exits"} {
		t.Run(how, func(t *testing.T) {
			s := startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "nop", true)
			args := append([]string{"--pid", fmt.Sprint(s.Pid), "--protocol", "int3", "--int3-wait", "2s", "--enable", "*"}, s.probeArgs...)
			hp := exec.Command(testutil.Command(t, "hotpatch"), args...)
			var stderr bytes.Buffer
			hp.Stderr = &stderr
			if err := testutil.StartBound(hp); err != nil {
				t.Fatal(err)
			}
			awaitMidPatch(t, s)
			if sig, ok := sigs[how]; ok {
				hp.Process.Signal(sig)
			} else {
				s.Cmd.Process.Kill()
			}
			done := make(chan error, 1)
			go func() { done <- hp.Wait() }()
			select {
			case err := <-done:
				if err == nil {
					t.Fatalf("hotpatch exited 0 after %s", how)
				}
			case <-time.After(time.Minute):
				hp.Process.Kill()
				t.Fatalf("hotpatch did not exit within a minute of %s", how)
			}
			if strings.Count(stderr.String(), "\n") != 1 {
				t.Errorf("stderr is not one line: %q", stderr.String())
			}
			if how == "target-exits" {
				if code := hp.ProcessState.ExitCode(); code != 4 || !strings.Contains(stderr.String(), fmt.Sprintf("pid %d exited", s.Pid)) {
					t.Errorf("target exited mid-batch: exit %d, %q; want 4 and \"pid %d exited\"", code, stderr.String(), s.Pid)
				}
				return
			}
			for _, st := range s.states(t) {
				if st.State != "on" && st.State != "off" {
					t.Errorf("probe %d (%s %s) left %s: %s", st.ID, st.Kind, st.Function, st.State, st.Bytes)
				}
			}
			// Rolled back or completed, depending on the phase SIGINT met;
			// either is valid as long as every site holds a whole form.
			if !s.Alive() {
				t.Fatal("target died")
			}
			s.finish(t)
		})
	}
}

// TestKilledMidPatch: hotpatch SIGKILLed (which no one can catch) while
// its int3s are in place leaves them there. The sites chosen, main's entry
// and exit, are not executed while main waits, so the target survives to
// show what a kill leaves; the next hotpatch run recognises the int3s as
// its own, repairs them with a message and does what it is asked, as does
// `hotpatch repair`. Neither reports a stale probe list.
func TestKilledMidPatch(t *testing.T) {
	testutil.RequirePtrace(t)
	for _, then := range []string{"next-run", "repair"} {
		t.Run(then, func(t *testing.T) {
			s := startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "nop", true)
			pid := fmt.Sprint(s.Pid)
			args := append([]string{"--pid", pid, "--protocol", "int3", "--int3-wait", "10s", "--enable", "main"}, s.probeArgs...)
			hp := exec.Command(testutil.Command(t, "hotpatch"), args...)
			if err := testutil.StartBound(hp); err != nil {
				t.Fatal(err)
			}
			awaitMidPatch(t, s)
			hp.Process.Kill()
			hp.Wait()
			torn := 0
			for _, st := range s.states(t) {
				if st.State == "mid-patch" {
					torn++
				}
			}
			if torn == 0 {
				t.Fatal("no site left mid-patch by the kill")
			}
			var r cmdResult
			if then == "repair" {
				r = command(t, "hotpatch", append([]string{"repair", "--pid", pid}, s.probeArgs...)...)
				if r.Code != 0 || strings.Count(r.Stdout, "repaired ") != torn || !strings.Contains(r.Stdout, "interrupted hotpatch") {
					t.Fatalf("repair: exit %d, stdout %q, stderr %q; want %d repaired lines", r.Code, r.Stdout, r.Stderr, torn)
				}
				again := command(t, "hotpatch", append([]string{"repair", "--pid", pid}, s.probeArgs...)...)
				if again.Code != 0 || strings.TrimSpace(again.Stdout) != "nothing to repair" {
					t.Errorf("second repair: exit %d, %q", again.Code, again.Stdout)
				}
			} else {
				r = command(t, "hotpatch", append([]string{"--pid", pid, "--protocol", "int3", "--enable", "main"}, s.probeArgs...)...)
				if r.Code != 0 || strings.Count(r.Stderr, "repaired ") != torn || strings.Contains(r.Stderr, "stale") {
					t.Fatalf("next run: exit %d, stderr %q; want %d repaired lines and success", r.Code, r.Stderr, torn)
				}
			}
			for _, st := range s.states(t) {
				if st.State != "on" && st.State != "off" {
					t.Errorf("probe %d (%s %s) left %s: %s", st.ID, st.Kind, st.Function, st.State, st.Bytes)
				}
				if then == "next-run" && st.Function == "main" && st.State != "on" {
					t.Errorf("main's %s probe is %s after --enable main", st.Kind, st.State)
				}
			}
			s.finish(t) // main's exit site runs now: whole, or the target dies here
		})
	}
}

// awaitMidPatch polls the sites until one holds an int3: the batch is in
// its first wait.
func awaitMidPatch(t *testing.T, s *subject) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var lists []string
	if len(s.probeArgs) > 1 {
		lists = s.probeArgs[1:]
	}
	for time.Now().Before(deadline) {
		st, err := Status(s.Pid, lists)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range st {
			if p.State == "mid-patch" {
				return
			}
		}
	}
	t.Fatal("no site showed an int3 within a minute")
}

// TestStrippedAfterColdpatch: iProbe's workflow for binaries shipped
// stripped: coldpatch the build, keep its probe list, strip, deploy. The list
// finds the stripped copy by build-id.
func TestStrippedAfterColdpatch(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireTool(t, "strip")
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"mt.c", "hooks.c"}, Static: true, PIE: testutil.Bool(false)})
	list := testutil.ProbeList(t, filepath.Join(t.TempDir(), "probes.json"), fx.Path)
	// Read the counters' addresses before the symbols go.
	p := testutil.Start(t, nil, fx.Path)
	enters, exits, progress := p.Symbol(fx.Path, "enters"), p.Symbol(fx.Path, "exits"), p.Symbol(fx.Path, "progress")
	p.Finish()
	if out, err := exec.Command("strip", "--strip-all", fx.Path).CombinedOutput(); err != nil {
		t.Fatalf("strip: %v %s", err, out)
	}
	s := &subject{Process: testutil.Start(t, nil, fx.Path), enters: enters, exits: exits, progress: progress, probeArgs: []string{"--probes", list}}
	s.expectFrozen(t, "stripped cold binary")
	s.hotpatch(t, "--enable", "work")
	s.expectMoving(t, "work on in the stripped copy", true, true)
	s.hotpatch(t, "--disable", "work")
	s.expectFrozen(t, "off again")
	s.finish(t)
}

// TestProbeCache: a second hotpatch call takes its list, or without one
// the scans of the objects, from the probe cache; a list rewritten since
// (to the same size) is read again, never served from the cache; a cache
// directory others may write is refused with a warning, and hotpatch still
// works.
func TestProbeCache(t *testing.T) {
	testutil.RequirePtrace(t)
	cache := filepath.Join(t.TempDir(), "cache")
	t.Setenv("EDGEPROBE_CACHE", cache)
	s := startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", PIE: testutil.Bool(true)}, "flip", true)
	stats := func(r cmdResult) (hits, misses int) {
		t.Helper()
		prefix := "probe cache " + cache + ": "
		i := strings.Index(r.Stderr, prefix)
		if i < 0 {
			t.Fatalf("no cache statistics in stderr:\n%s", r.Stderr)
		}
		if _, err := fmt.Sscanf(r.Stderr[i+len(prefix):], "%d hits, %d misses", &hits, &misses); err != nil {
			t.Fatal(err)
		}
		return hits, misses
	}
	expect := func(r cmdResult, hits, misses int) {
		t.Helper()
		if h, m := stats(r); h != hits || m != misses {
			t.Fatalf("%d hits and %d misses, want %d and %d", h, m, hits, misses)
		}
	}
	// The list, and the scan of the executable its sites are verified
	// against (verify.go).
	expect(s.hotpatch(t, "-v", "--enable", "leaf"), 0, 2)
	s.expectMoving(t, "leaf on", true, true)
	expect(s.hotpatch(t, "-v", "--disable", "leaf"), 2, 0)
	s.expectFrozen(t, "leaf off")

	// The same list with leaf renamed, as long as before.
	list := s.probeArgs[1]
	b, err := os.ReadFile(list)
	if err != nil {
		t.Fatal(err)
	}
	renamed := bytes.ReplaceAll(b, []byte(`"function": "leaf"`), []byte(`"function": "lfea"`))
	if bytes.Equal(renamed, b) || len(renamed) != len(b) {
		t.Fatal("no leaf probe to rename")
	}
	if err := os.WriteFile(list, renamed, 0o644); err != nil {
		t.Fatal(err)
	}
	expect(s.hotpatch(t, "-v", "--enable", "lfea"), 1, 1)
	s.expectMoving(t, "lfea (leaf) on", true, true)
	if r := command(t, "hotpatch", append([]string{"--pid", fmt.Sprint(s.Pid)}, append(s.probeArgs, "--enable", "leaf")...)...); r.Code != 3 {
		t.Fatalf("the old name still selects: exit %d: %s", r.Code, r.Stderr)
	}

	// Without a list: each mapped object's scan (the executable's is cached
	// already; the preloaded hooks, libc, ld.so), then all of them from the
	// cache.
	s.probeArgs = nil
	hits, misses := stats(s.hotpatch(t, "-v", "--disable", "leaf"))
	if hits != 1 || misses < 3 {
		t.Fatalf("first call without a list: %d hits, %d misses; want 1 (the executable) and one per other mapped object", hits, misses)
	}
	expect(s.hotpatch(t, "-v", "--enable", "leaf"), hits+misses, 0)
	s.expectMoving(t, "leaf on, from cached scans", true, true)

	if err := os.Chmod(cache, 0o777); err != nil {
		t.Fatal(err)
	}
	r := s.hotpatch(t, "--disable", "*")
	if !strings.Contains(r.Stderr, "not private") || !strings.Contains(r.Stderr, "not cached") {
		t.Fatalf("no warning about a shared cache directory: %q", r.Stderr)
	}
	s.expectFrozen(t, "all off, uncached")
	s.finish(t)
}
