package inject_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// bigRuntime is the runtime with 64 MiB of data added (bigpad.c): a load
// fills the target's memfd with it long enough for a test to act meanwhile.
func bigRuntime(t *testing.T) string {
	t.Helper()
	srcs, hdrs := testutil.RuntimeFiles(t)
	rel := func(names []string) []string {
		var out []string
		for _, n := range names {
			out = append(out, "../../runtime/"+n)
		}
		return out
	}
	return testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: append(rel(srcs), "bigpad.c"), Deps: rel(hdrs), Shared: true,
		NoInstr: true, Flags: testutil.RuntimeFlags, Name: "libedgeprobe.so"}).Path
}

// runtimeMemfd returns the size of the target's memfd the load is filling,
// or -1 while there is none.
func runtimeMemfd(pid int) int64 {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return -1
	}
	for _, e := range ents {
		link, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil || !strings.Contains(link, "memfd:edgeprobe-runtime") {
			continue
		}
		if st, err := os.Stat(filepath.Join(dir, e.Name())); err == nil {
			return st.Size()
		}
	}
	return -1
}

// TestKilledDuringLoad: hotpatch SIGKILLed while it loads the runtime into
// a program started without it (the borrowed thread waiting while the
// runtime's bytes go into its memfd) leaves the program running: every
// thread goes on, the program ends with its correct output, and the next
// hotpatch loads the runtime and records. Before Borrowed.Park the
// borrowed thread sat at the fault that ends a call (rip 0, SIGSEGV
// pending) and the kernel, detaching it, delivered that SIGSEGV.
func TestKilledDuringLoad(t *testing.T) {
	testutil.RequirePtrace(t)
	useRuntime(t)
	big := bigRuntime(t)
	st, err := os.Stat(big)
	if err != nil {
		t.Fatal(err)
	}
	bin := attachFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	// An attempt counts only if the kill landed while the memfd was being
	// filled (its size short of the runtime's after the kill): on a loaded
	// machine the test may be descheduled past the fill, into the calls
	// after it, whose window is the documented residual (D59).
	var (
		p      *testutil.Process
		stderr strings.Builder
	)
	for attempt := 1; ; attempt++ {
		if attempt > 5 {
			t.Fatal("5 attempts, none killed hotpatch while it filled the memfd")
		}
		p = testutil.Start(t, nil, bin)
		hp := exec.Command(testutil.Command(t, "hotpatch"), "--pid", fmt.Sprint(p.Pid), "--enable", "work", "--runtime", big)
		stderr.Reset()
		hp.Stderr = &stderr
		if err := testutil.StartBound(hp); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- hp.Wait() }()
		deadline := time.Now().Add(time.Minute)
		finished := false
		for runtimeMemfd(p.Pid) <= 0 && !finished {
			select {
			case err := <-done:
				t.Logf("attempt %d: hotpatch ended (%v) before the test saw the memfd fill", attempt, err)
				finished = true
			default:
			}
			if time.Now().After(deadline) {
				t.Fatal("no memfd being filled in a minute")
			}
			runtime.Gosched()
		}
		if !finished {
			hp.Process.Kill()
			if err := <-done; err == nil || !strings.Contains(err.Error(), "killed") {
				t.Logf("attempt %d: hotpatch: %v, not killed mid-load", attempt, err)
				finished = true
			}
		}
		if !finished {
			// Killed inside the fill, or the target is gone (which the
			// checks below report); no memfd in a live target: the load
			// got past the loader's close of it.
			n := runtimeMemfd(p.Pid)
			if n >= 0 && n < st.Size() || n < 0 && !p.Alive() {
				break
			}
			t.Logf("attempt %d: the kill came after the fill", attempt)
		}
		p.Cmd.Process.Kill()
		p.Wait()
	}
	died := func() {
		if !p.Alive() {
			t.Fatalf("the target died when hotpatch was killed during the load: %v (hotpatch stderr %q)", p.Wait(), stderr.String())
		}
	}
	died()
	progress := p.Symbol(bin, "progress")
	pid := fmt.Sprint(p.Pid)
	// The kernel resumes the borrowed thread as it detaches it: the target
	// must go on (its counter grows by 20000 more) rather than die.
	start := p.Read64(progress)
	for deadline := time.Now().Add(time.Minute); ; runtime.Gosched() {
		died()
		if p.Read64(progress)-start >= 20000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the target made no progress in a minute after hotpatch was killed during the load")
		}
	}

	// The next hotpatch loads the runtime (the killed load never reached
	// dlopen) and its probes record.
	r := hotpatchOK(t, "--pid", pid, "--enable", "work")
	if !loadedNote.MatchString(r.Stderr) {
		t.Fatalf("the hotpatch after the killed one: want the load note, stderr %q", r.Stderr)
	}
	p.AwaitProgress(progress, 20000)
	if w := funcStats(statsOf(t, p.Pid), "work"); w.Entries == 0 || w.Exits == 0 {
		t.Fatalf("work after the second load: %+v", w)
	}
	out, _ := p.Finish()
	if !strings.Contains(out, "done wrong=0") {
		t.Fatalf("program output %q, want done wrong=0", out)
	}
}

// TestInjectStoppedRefused: a program stopped with SIGSTOP is not loaded
// into (no thread can be borrowed from a group-stop without continuing
// the process): one line that says so and how to continue it, exit 1,
// nothing changed; once continued, the load works and the program ends
// with its correct output.
func TestInjectStoppedRefused(t *testing.T) {
	testutil.RequirePtrace(t)
	useRuntime(t)
	bin := attachFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	p := testutil.Start(t, nil, bin)
	progress := p.Symbol(bin, "progress")
	pid := fmt.Sprint(p.Pid)
	if err := p.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); !stopped(p.Pid); runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatal("the program did not stop within a minute of SIGSTOP")
		}
	}
	r := testutil.Run(t, "hotpatch", "--pid", pid, "--enable", "work")
	if r.Code != 1 || strings.Count(r.Stderr, "\n") != 1 || !strings.Contains(r.Stderr, "is stopped") || !strings.Contains(r.Stderr, "kill -CONT "+pid) {
		t.Fatalf("enable in a stopped program: exit %d, stderr %q; want 1 and one line saying it is stopped", r.Code, r.Stderr)
	}
	if runtimeMemfd(p.Pid) >= 0 {
		t.Fatal("the refused load left a memfd in the program")
	}
	if err := p.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	p.AwaitProgress(progress, 20000)
	r = hotpatchOK(t, "--pid", pid, "--enable", "work")
	if !loadedNote.MatchString(r.Stderr) {
		t.Fatalf("enable after SIGCONT: want the load note, stderr %q", r.Stderr)
	}
	p.AwaitProgress(progress, 20000)
	if w := funcStats(statsOf(t, p.Pid), "work"); w.Entries == 0 {
		t.Fatalf("work after the load: %+v", w)
	}
	out, _ := p.Finish()
	if !strings.Contains(out, "done wrong=0") {
		t.Fatalf("program output %q, want done wrong=0", out)
	}
}

// stopped reports whether every thread of pid is in a group-stop (state T).
func stopped(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] == 'T'
}

// TestKilledInLoadCalls: hotpatch SIGKILLed inside each of the four calls
// a load makes on the borrowed thread (mmap, memfd_create, mprotect,
// pthread_create), while the thread runs the call ("in") and once the call
// has returned ("end"), deterministically ($EDGEPROBE_TEST_KILL_AT: hotpatch
// kills itself at that step), with the reader (blocked in read: its call
// must be restarted, no byte lost), the sleeper (in nanosleep: no sleep cut
// short, no EINTR) or whichever thread is safe borrowed, in the hazard
// fixture. Each time the program must go on unharmed (its counter grows,
// its final line is the correct one), and the next hotpatch must load the
// runtime (or find it loaded: a kill once pthread_create ran leaves the
// loader thread to finish the load) and record. Before the fix (D70) every
// one died of SIGSEGV: a call's return address was 0, and the kernel,
// detaching the thread, ran it into that fault (or delivered the SIGSEGV it
// sat in).
func TestKilledInLoadCalls(t *testing.T) {
	testutil.RequirePtrace(t)
	useRuntime(t)
	bin := attachFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	const want = "done wrong=0 pipe=ok short=0 eintr=0 signals=ok\n"
	for _, call := range []string{"mmap", "memfd_create", "mprotect", "pthread_create"} {
		for _, when := range []string{"in", "end"} {
			for _, thread := range []string{"reader", "sleeper", ""} {
				step := call + ":" + when
				t.Run(step+"/"+thread, func(t *testing.T) {
					p := testutil.Start(t, nil, bin, "hazard")
					progress := p.Symbol(bin, "progress")
					p.AwaitProgress(progress, 1000)
					stderr, err := hotpatchAtStep(t, p.Pid, step, thread)
					if err == nil || !strings.Contains(err.Error(), "killed") {
						t.Fatalf("hotpatch with the kill at %s: %v, want killed (stderr %q)", step, err, stderr)
					}
					runsOnAfter(t, p, progress, "hotpatch was killed at "+step, stderr)
					r := hotpatchOK(t, "--pid", fmt.Sprint(p.Pid), "--enable", "work")
					if call != "pthread_create" && !loadedNote.MatchString(r.Stderr) {
						t.Fatalf("the hotpatch after the one killed at %s: want the load note, stderr %q", step, r.Stderr)
					}
					recordsAndEnds(t, p, progress, want, stderr)
				})
			}
		}
	}
}

// TestCancelledInLoadCalls: a load cancelled while the borrowed thread
// runs one of its calls (SIGINT or SIGTERM to hotpatch, or the call's time
// limit: the call is abandoned) fails in one line and leaves the program
// unharmed; the next hotpatch loads (or finds loaded) the runtime. Before
// the fix an abandoned safe call could stop the thread in a system-call
// stop, which abandon took for a signal's: the SIGTRAP of that stop was
// then delivered to the program at the restore and killed it.
func TestCancelledInLoadCalls(t *testing.T) {
	testutil.RequirePtrace(t)
	useRuntime(t)
	bin := attachFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	const want = "done wrong=0 pipe=ok short=0 eintr=0 signals=ok\n"
	for _, call := range []string{"mmap", "memfd_create", "mprotect", "pthread_create"} {
		for _, thread := range []string{"reader", "sleeper", ""} {
			step := call + ":cancel"
			t.Run(step+"/"+thread, func(t *testing.T) {
				p := testutil.Start(t, nil, bin, "hazard")
				progress := p.Symbol(bin, "progress")
				p.AwaitProgress(progress, 1000)
				stderr, err := hotpatchAtStep(t, p.Pid, step, thread)
				// The cancel is seen when the thread next waits, so the load
				// may also end first; either way, one line at most.
				if err != nil && strings.Count(stderr, "\n") != 1 {
					t.Fatalf("hotpatch cancelled in %s: %v, stderr %q; want one line", call, err, stderr)
				}
				runsOnAfter(t, p, progress, "the load was cancelled in "+call, stderr)
				hotpatchOK(t, "--pid", fmt.Sprint(p.Pid), "--enable", "work")
				recordsAndEnds(t, p, progress, want, stderr)
			})
		}
	}
}

// hotpatchAtStep runs `hotpatch --enable work` on pid with the load's test
// hook set to step (EDGEPROBE_TEST_KILL_AT) and the borrowed thread chosen
// by thread, and returns its stderr and error.
func hotpatchAtStep(t *testing.T, pid int, step, thread string) (string, error) {
	t.Helper()
	hp := exec.Command(testutil.Command(t, "hotpatch"), "--pid", fmt.Sprint(pid), "--enable", "work")
	hp.Env = append(os.Environ(), "EDGEPROBE_TEST_KILL_AT="+step, "EDGEPROBE_INJECT_THREAD="+thread)
	var stderr strings.Builder
	hp.Stderr = &stderr
	err := testutil.RunBound(hp)
	return stderr.String(), err
}

// runsOnAfter fails the test unless the program is alive and makes 20,000
// more steps of progress within a minute of what (a sentence: "hotpatch
// was killed at ..."); hpStderr is the failed hotpatch's, for the message.
func runsOnAfter(t *testing.T, p *testutil.Process, progress uint64, what, hpStderr string) {
	t.Helper()
	if !p.Alive() {
		t.Fatalf("the target died when %s: %v (hotpatch stderr %q)", what, p.Wait(), hpStderr)
	}
	start := p.Read64(progress)
	for deadline := time.Now().Add(time.Minute); p.Read64(progress)-start < 20000; runtime.Gosched() {
		if !p.Alive() {
			t.Fatalf("the target died after %s: %v (hotpatch stderr %q)", what, p.Wait(), hpStderr)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the target made no progress in a minute after %s", what)
		}
	}
}

// recordsAndEnds fails the test unless, after a later hotpatch enabled
// work, the program records work's calls and ends with the output want.
func recordsAndEnds(t *testing.T, p *testutil.Process, progress uint64, want, hpStderr string) {
	t.Helper()
	p.AwaitProgress(progress, 20000)
	if st := statsOf(t, p.Pid); funcStats(st, "work").Entries == 0 || funcStats(st, "work").Exits == 0 {
		// Seen about once in a hundred runs under load after a kill at
		// pthread_create:end, cause not yet known: say all that may tell it.
		raw := hotpatchOK(t, "stats", "--pid", fmt.Sprint(p.Pid), "--json")
		again := testutil.Run(t, "hotpatch", "--pid", fmt.Sprint(p.Pid), "--enable", "work", "-v")
		t.Fatalf("work after the load: %+v\nstats: %s\na second --enable work -v: exit %d, stderr %q; work then: %+v\nthe killed hotpatch's stderr: %q",
			funcStats(st, "work"), raw.Stdout, again.Code, again.Stderr, funcStats(statsOf(t, p.Pid), "work"), hpStderr)
	}
	out, perr := p.Finish()
	if out != want {
		t.Fatalf("program output %q (stderr %q), want %q; hotpatch %q", out, perr, want, hpStderr)
	}
}
