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
	bin := attachFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	p := testutil.Start(t, nil, bin)
	progress := p.Symbol(bin, "progress")
	pid := fmt.Sprint(p.Pid)

	hp := exec.Command(testutil.Command(t, "hotpatch"), "--pid", pid, "--enable", "work", "--runtime", big)
	var stderr strings.Builder
	hp.Stderr = &stderr
	if err := hp.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- hp.Wait() }()
	deadline := time.Now().Add(time.Minute)
	for runtimeMemfd(p.Pid) <= 0 {
		select {
		case err := <-done:
			t.Fatalf("hotpatch ended (%v, stderr %q) before the test saw it fill the runtime's memfd: the load was too quick to interrupt", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no memfd being filled in a minute")
		}
		runtime.Gosched()
	}
	hp.Process.Kill()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("hotpatch: %v, want killed mid-load (stderr %q)", err, stderr.String())
	}
	// The kernel resumes the borrowed thread as it detaches it: the target
	// must go on (its counter grows by 20000 more) rather than die.
	died := func() {
		if !p.Alive() {
			t.Fatalf("the target died when hotpatch was killed during the load: %v (hotpatch stderr %q)", p.Wait(), stderr.String())
		}
	}
	died()
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
