package hotpatch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// inflightCounters reads the runtime's in-flight table counters of a live
// subject (D89): traps the SIGTRAP handler took, sites it repaired, traps
// it had to wait out.
func inflightCounters(t *testing.T, s *subject) (traps, repairs, holds uint64) {
	t.Helper()
	r, err := shm.OpenPID(procfs.Via(s.Pid)) // the main thread may have exited
	if err != nil {
		t.Fatalf("the runtime's region: %v", err)
	}
	h := r.Header()
	r.Close()
	if h.Inflight == 0 {
		t.Fatalf("the runtime's region (version %d) names no in-flight table", h.Version)
	}
	return s.Read64(h.Inflight + shm.InflightTrapsOff), s.Read64(h.Inflight + shm.InflightRepairsOff), s.Read64(h.Inflight + shm.InflightHoldsOff)
}

// awaitHeldUnrepaired waits (a minute at most) until the SIGTRAP handler
// holds a thread of s, failing if it repairs a site meanwhile: held names
// what holds the process (a session), so the handler must leave the text.
func awaitHeldUnrepaired(t *testing.T, s *subject, held string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		_, repairs, holds := inflightCounters(t, s)
		if repairs != 0 {
			t.Fatalf("the handler repaired %d sites while %s held the process", repairs, held)
		}
		if holds > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no thread was held by the SIGTRAP handler in a minute")
		}
		time.Sleep(time.Millisecond) // polling, not synchronisation
	}
}

// killMidPatch starts `hotpatch --protocol int3 --enable work` with a
// long first wait, and SIGKILLs it once a site holds its int3: the workers
// run work() in a loop, so they meet the int3 with no tracer at once.
func killMidPatch(t *testing.T, s *subject, env ...string) {
	t.Helper()
	killMidPatchOf(t, s, "work", env...)
}

// killMidPatchOf is killMidPatch for the probes of fn.
func killMidPatchOf(t *testing.T, s *subject, fn string, env ...string) {
	t.Helper()
	args := append([]string{"--pid", fmt.Sprint(s.Pid), "--protocol", "int3", "--int3-wait", "10s", "--enable", fn}, s.probeArgs...)
	hp := exec.Command(testutil.Command(t, "hotpatch"), args...)
	hp.Env = append(hp.Environ(), env...)
	if err := testutil.StartBound(hp); err != nil {
		t.Fatal(err)
	}
	awaitMidPatch(t, s)
	_ = hp.Process.Kill()
	_ = hp.Wait()
}

// deathSignal waits for the subject's end and names the signal that ended
// it ("exit" for an exit).
func deathSignal(s *subject) string {
	err := s.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return ws.Signal().String()
		}
	}
	return "exit"
}

// TestKilledMidPatchSurvives: a hotpatch SIGKILLed with int3s in the text
// of a process that runs the runtime. Four threads run the sites in a loop,
// so they reach the int3s with no tracer: the runtime's SIGTRAP handler
// (D89, D90) takes each trap, and either makes the sites whole itself
// ("in-process") or, with EDGEPROBE_TRAP_REPAIR=0, holds the threads until
// `hotpatch repair` does ("held"). Either way the target lives, every site
// ends whole, and the probes then count as before. "no-table": hotpatch
// does not list the sites (as with a runtime older than the table): the
// handler does not recognise the trap and the process dies of SIGTRAP,
// exactly as without the runtime (today's residual for old runtimes).
func TestKilledMidPatchSurvives(t *testing.T) {
	testutil.RequirePtrace(t)
	lib := testutil.Runtime(t, "gcc")
	for _, mode := range []string{"in-process", "held", "no-table"} {
		t.Run(mode, func(t *testing.T) {
			var env []string
			if mode == "held" {
				env = append(env, "EDGEPROBE_TRAP_REPAIR=0")
			}
			s := startMTEnv(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "nop", true, lib, env)
			s.expectFrozen(t, "cold binary at start")
			var kenv []string
			if mode == "no-table" {
				kenv = append(kenv, EnvTestNoGuard+"=1")
			}
			killMidPatch(t, s, kenv...)
			if mode == "no-table" {
				if progressOrDeath(t, s, 1<<62) {
					t.Fatal("unreachable")
				}
				if sig := deathSignal(s); sig != syscall.SIGTRAP.String() {
					t.Fatalf("without the table the target died of %s, want SIGTRAP", sig)
				}
				return
			}
			if mode == "held" {
				// The workers are held in the handler: wait until one is,
				// then repair from outside.
				deadline := time.Now().Add(time.Minute)
				for {
					if _, _, holds := inflightCounters(t, s); holds > 0 {
						break
					}
					time.Sleep(time.Millisecond) // polling, not synchronisation
					if !s.Alive() {
						t.Fatalf("target died: %s", deathSignal(s))
					}
					if time.Now().After(deadline) {
						t.Fatal("no thread was held by the SIGTRAP handler in a minute")
					}
				}
				torn := 0
				for _, st := range s.states(t) {
					if st.State == stateTorn {
						torn++
					}
				}
				r := command(t, "hotpatch", append([]string{"repair", "--pid", fmt.Sprint(s.Pid)}, s.probeArgs...)...)
				if r.Code != 0 || torn == 0 || strings.Count(r.Stdout, "repaired ") != torn {
					t.Fatalf("repair of %d mid-patch site(s): exit %d, stdout %q, stderr %q", torn, r.Code, r.Stdout, r.Stderr)
				}
			}
			if !progressOrDeath(t, s, 20000) {
				t.Fatalf("the target died after the kill: %s", deathSignal(s))
			}
			traps, repairs, holds := inflightCounters(t, s)
			t.Logf("%s: handler took %d traps, repaired %d sites, held %d", mode, traps, repairs, holds)
			if traps == 0 {
				t.Fatal("no trap reached the runtime's SIGTRAP handler: the kill came too late to test anything")
			}
			if mode == "in-process" && repairs == 0 {
				t.Fatal("the handler repaired nothing, yet the target runs")
			}
			if mode == "held" && repairs != 0 {
				t.Fatalf("EDGEPROBE_TRAP_REPAIR=0, yet the handler repaired %d sites", repairs)
			}
			for _, st := range s.states(t) {
				if st.State != "on" && st.State != "off" {
					t.Fatalf("probe %d (%s %s) left %s: %s", st.ID, st.Kind, st.Function, st.State, st.Bytes)
				}
			}
			// The probes count as before: work's on, then everything off.
			s.hotpatch(t, "--protocol", "int3", "--enable", "work")
			s.expectMoving(t, "work on after the kill", true, true)
			s.hotpatch(t, "--protocol", "int3", "--disable", "*")
			s.expectFrozen(t, "all off after the kill")
			s.finish(t)
		})
	}
}

// runEnd runs bin with args and env and says how it ended: its stdout and
// "exit N" or the signal that killed it.
func runEnd(t *testing.T, env []string, bin string, args ...string) (string, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(cmd.Environ(), env...)
	out, err := testutil.OutputBound(cmd)
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), "exit 0"
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return string(out), ws.Signal().String()
		}
		return string(out), fmt.Sprintf("exit %d", ee.ExitCode())
	}
	t.Fatalf("%s %v: %v", bin, args, err)
	return "", ""
}

// TestTrapChain: the runtime's SIGTRAP handler (D89) hands every trap that
// is not one of hotpatch's to the disposition the program had: a
// SA_SIGINFO handler (with the siginfo: raise's SI_TKILL, an int3's
// SI_KERNEL), a plain handler, SIG_DFL (the process dies of SIGTRAP, as
// without the runtime, for raise and for an int3), SIG_IGN (raise ignored,
// an int3 fatal as the kernel forces it). Each mode of the fixture runs
// without the runtime, with it loaded after the disposition was set
// (dlopen, as hotpatch loads it) and preloaded; all three must end alike.
func TestTrapChain(t *testing.T) {
	lib := testutil.Runtime(t, "gcc")
	fx := testutil.Build(t, testutil.Spec{Compiler: "gcc", Sources: []string{"trapchain.c"}, NoInstr: true})
	want := map[string][2]string{
		"siginfo": {"siginfo calls=2 codes=TKILL,KERNEL\n", "exit 0"},
		"plain":   {"plain calls=2\n", "exit 0"},
		"default": {"", syscall.SIGTRAP.String()},
		"int3":    {"", syscall.SIGTRAP.String()},
		"ignore":  {"ignore survived\n", "exit 0"},
		"ignint3": {"", syscall.SIGTRAP.String()},
	}
	for _, mode := range []string{"siginfo", "plain", "default", "int3", "ignore", "ignint3"} {
		t.Run(mode, func(t *testing.T) {
			out, end := runEnd(t, nil, fx.Path, mode)
			if w := want[mode]; out != w[0] || end != w[1] {
				t.Fatalf("without the runtime: %q, %s; the fixture expects %q, %s", out, end, w[0], w[1])
			}
			for _, how := range []struct {
				name string
				env  []string
				args []string
			}{
				{"dlopen", nil, []string{mode, lib}},
				{"preload", []string{"LD_PRELOAD=" + lib}, []string{mode}},
			} {
				o, e := runEnd(t, how.env, fx.Path, how.args...)
				if o != out || e != end {
					t.Errorf("runtime %s: %q, %s; without it %q, %s", how.name, o, e, out, end)
				}
			}
		})
	}
}

// TestHandlerRepairRace: a hotpatch that attaches while a thread's SIGTRAP
// handler is repairing sites in-process (D90) must wait for it before it
// reads a site. A test build of the runtime holds the handler right before
// its byte-0 write, repair lock taken (trappark.c); then an int3 enable of
// the same sites runs. It must wait (it says so: EnvTestHandlerWait); the
// handler is let go, finishes, and the enable then finds the sites whole and turns them
// on. Without the wait the enable repairs the sites itself and turns them
// on, and the handler, let go afterwards, writes the byte 0 it chose
// before over the new form: the site is left foreign (checked).
func TestHandlerRepairRace(t *testing.T) {
	testutil.RequirePtrace(t)
	lib := testutil.RuntimeWith(t, "gcc", "-DEP_TEST_PARK")
	park := testutil.Build(t, testutil.Spec{Compiler: "gcc", Sources: []string{"trappark.c"}, Shared: true, NoInstr: true, Name: "libtrappark.so"}).Path
	gate := filepath.Join(t.TempDir(), "go")
	s := startMTEnv(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "nop", true, lib+":"+park, []string{"EP_TRAP_PARK=" + gate})
	s.expectFrozen(t, "cold binary at start")
	killMidPatch(t, s)
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(gate + ".parked"); err == nil {
			break
		}
		if !s.Alive() {
			t.Fatalf("target died: %s", deathSignal(s))
		}
		if time.Now().After(deadline) {
			t.Fatal("no handler reached its byte-0 write in a minute")
		}
		time.Sleep(time.Millisecond) // polling, not synchronisation
	}
	waitFile := filepath.Join(t.TempDir(), "waiting")
	hp := exec.Command(testutil.Command(t, "hotpatch"), append([]string{"--pid", fmt.Sprint(s.Pid), "--protocol", "int3", "--enable", "work"}, s.probeArgs...)...)
	hp.Env = append(hp.Environ(), EnvTestHandlerWait+"="+waitFile)
	var stderr strings.Builder
	hp.Stderr = &stderr
	if err := testutil.StartBound(hp); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- hp.Wait() }()
	var err error
	ended := false
	for waiting := false; !waiting; {
		select {
		case err = <-done:
			t.Errorf("the enable ended (%v) without waiting for the handler's repair", err)
			waiting, ended = true, true
		default:
			if _, serr := os.Stat(waitFile); serr == nil {
				waiting = true
			} else {
				time.Sleep(time.Millisecond) // polling, not synchronisation
			}
		}
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if !ended {
		err = <-done
	}
	if err != nil {
		t.Fatalf("enable: %v: %s", err, stderr.String())
	}
	if !progressOrDeath(t, s, 20000) {
		t.Fatalf("the target died: %s", deathSignal(s))
	}
	if _, repairs, _ := inflightCounters(t, s); repairs == 0 {
		t.Error("the handler repaired nothing")
	}
	for _, st := range s.states(t) {
		if st.State != "on" && st.State != "off" {
			t.Fatalf("probe %d (%s %s) left %s: %s", st.ID, st.Kind, st.Function, st.State, st.Bytes)
		}
		if st.Function == "work" && st.State != "on" {
			t.Errorf("work's %s probe is %s after the enable", st.Kind, st.State)
		}
	}
	s.expectMoving(t, "work on", true, true)
	s.finish(t)
}

// TestForkAfterKill: children forked after hotpatch was killed with an int3
// on a function only they run (forkkill.c's child_work) inherit the int3
// with their copy of the text, and with it the runtime's handler and their
// copy of the in-flight table: each repairs its own text and exits 0. The
// parent, which never runs the function, keeps its int3 (mid-patch) until
// `hotpatch repair`: the children did meet one. "no-table" (hotpatch lists
// nothing): the children die of SIGTRAP.
func TestForkAfterKill(t *testing.T) {
	testutil.RequirePtrace(t)
	lib := testutil.Runtime(t, "gcc")
	fx := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"forkkill.c"}})
	list := testutil.ProbeList(t, filepath.Join(t.TempDir(), "probes.json"), fx.Path, "--placeholder", "nop")
	for _, mode := range []string{"runtime", "no-table"} {
		t.Run(mode, func(t *testing.T) {
			s := &subject{probeArgs: []string{"--probes", list}}
			s.Process = testutil.Start(t, []string{"LD_PRELOAD=" + lib}, fx.Path)
			s.progress = s.Symbol(fx.Path, "forks")
			var env []string
			if mode == "no-table" {
				env = append(env, EnvTestNoGuard+"=1")
			}
			killMidPatchOf(t, s, "child_work", env...)
			if !progressOrDeath(t, s, 50) {
				t.Fatalf("the parent died: %s", deathSignal(s))
			}
			torn := 0
			for _, st := range s.states(t) {
				if st.State == stateTorn {
					torn++
				}
			}
			if torn == 0 {
				t.Fatal("no site of the parent is mid-patch: its children had no int3 to meet")
			}
			rr := command(t, "hotpatch", append([]string{"repair", "--pid", fmt.Sprint(s.Pid)}, s.probeArgs...)...)
			if rr.Code != 0 || strings.Count(rr.Stdout, "repaired ") != torn {
				t.Fatalf("repair of %d site(s): exit %d, %q, %q", torn, rr.Code, rr.Stdout, rr.Stderr)
			}
			out, _ := s.Finish()
			t.Logf("%s: %s", mode, strings.TrimSpace(out))
			switch {
			case mode == "runtime" && !strings.Contains(out, " bad=0 "):
				t.Errorf("children forked after the kill failed: %q", out)
			case mode == "no-table" && !strings.Contains(out, fmt.Sprintf("lastsig=%d", syscall.SIGTRAP)):
				t.Errorf("without the table the children should die of SIGTRAP: %q", out)
			}
		})
	}
}

// TestKilledAfterTrapReaped: hotpatch SIGKILLs itself (EDGEPROBE_TEST_KILL_AT
// =trap-reaped) right after its tracer reaped the first SIGTRAP stop of a
// thread at one of its int3s, before handling it: reaping cleared the
// thread's signal, so the thread resumes with none, at whatever PC it has.
// The tracer rewinds the PC before it reaps (prewind): the thread resumes
// at the site, executes the int3 again with no tracer, and the runtime's
// handler makes the site whole. Before prewind the thread resumed at site +
// 1 and ran the call's rel32 as instructions: the target died (SIGILL or
// SIGSEGV; checked by taking prewind out).
func TestKilledAfterTrapReaped(t *testing.T) {
	testutil.RequirePtrace(t)
	lib := testutil.Runtime(t, "gcc")
	s := startMTEnv(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "nop", true, lib, nil)
	s.expectFrozen(t, "cold binary at start")
	args := append([]string{"--pid", fmt.Sprint(s.Pid), "--protocol", "int3", "--int3-wait", "10s", "--enable", "work"}, s.probeArgs...)
	hp := exec.Command(testutil.Command(t, "hotpatch"), args...)
	hp.Env = append(hp.Environ(), EnvTestKillAt+"=trap-reaped")
	out, err := testutil.CombinedOutputBound(hp)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("hotpatch did not kill itself at a reaped trap: %v: %s", err, out)
	}
	if !progressOrDeath(t, s, 20000) {
		t.Fatalf("the target died: %s", deathSignal(s))
	}
	for _, st := range s.states(t) {
		if st.State != "on" && st.State != "off" {
			t.Fatalf("probe %d (%s %s) left %s: %s", st.ID, st.Kind, st.Function, st.State, st.Bytes)
		}
	}
	if traps, repairs, _ := inflightCounters(t, s); traps == 0 || repairs == 0 {
		t.Errorf("the handler took %d traps and repaired %d sites; the thread should have met the int3 again", traps, repairs)
	}
	s.finish(t)
}

// TestHandlerSkipsUnmappedEntry: entries outlive their objects (a library
// unloaded after its sites were listed). An entry at an unmapped address
// is appended to the live target's table, as a listing from before an
// unload would have left it; then hotpatch is killed mid-patch with four
// threads running the sites. The handler's repair reads every listed site:
// it must skip the unmapped one (it reads through /proc/self/mem) and
// repair the others; with a plain load there it faulted inside the
// handler and the target died of SIGSEGV (checked).
func TestHandlerSkipsUnmappedEntry(t *testing.T) {
	testutil.RequirePtrace(t)
	lib := testutil.Runtime(t, "gcc")
	s := startMTEnv(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "nop", true, lib, nil)
	r, err := shm.OpenPID(procfs.Via(s.Pid)) // the main thread may have exited
	if err != nil {
		t.Fatal(err)
	}
	table := r.Header().Inflight
	r.Close()
	entry, err := shm.EncodeInflightSite(nil, 0x1000, []byte{0xe8, 1, 2, 3, 4}, []byte{0x0f, 0x1f, 0x44, 0, 0})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", s.Pid), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	n := s.Read64(table + shm.InflightCountOff)
	if _, err := mem.WriteAt(entry, int64(table+shm.InflightSitesOff+n*shm.InflightSiteSize)); err != nil {
		t.Fatal(err)
	}
	var count [8]byte
	binary.LittleEndian.PutUint64(count[:], n+1)
	if _, err := mem.WriteAt(count[:], int64(table+shm.InflightCountOff)); err != nil {
		t.Fatal(err)
	}
	killMidPatch(t, s)
	if !progressOrDeath(t, s, 20000) {
		t.Fatalf("the target died: %s", deathSignal(s))
	}
	if _, repairs, _ := inflightCounters(t, s); repairs == 0 {
		t.Fatal("the handler repaired nothing")
	}
	for _, st := range s.states(t) {
		if st.State != "on" && st.State != "off" {
			t.Fatalf("probe %d (%s %s) left %s: %s", st.ID, st.Kind, st.Function, st.State, st.Bytes)
		}
	}
	s.finish(t)
}
