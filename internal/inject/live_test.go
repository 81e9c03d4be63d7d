package inject_test

// Injection tests: programs started normally (no preload), into which the
// hotpatch command loads the runtime (docs/injection.md). They run the real
// command as a separate process (docs/decisions.md, D7).

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/hotpatch"
	"github.com/edgeprobe/edgeprobe/internal/inject"
	"github.com/edgeprobe/edgeprobe/internal/report"
	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// hotpatchOK runs hotpatch and fails the test unless it exits 0.
func hotpatchOK(t *testing.T, args ...string) testutil.Result {
	t.Helper()
	return testutil.RunOK(t, "hotpatch", args...)
}

// hooksLib is hooks.c as a preloadable library: a program's own hooks.
func hooksLib(t *testing.T) string {
	t.Helper()
	return testutil.Build(t, testutil.Spec{Sources: []string{"hooks.c"}, Shared: true, NoInstr: true, Name: "libhooks.so"}).Path
}

// attachFixture builds libfix.so and attach.c linked to it, both with spec's
// compiler, PIE setting and provider.
func attachFixture(t *testing.T, spec testutil.Spec) string {
	bin, _ := attachFixtureLib(t, spec)
	return bin
}

// attachFixtureLib is attachFixture, also returning libfix.so's path.
func attachFixtureLib(t *testing.T, spec testutil.Spec) (string, string) {
	t.Helper()
	lib := testutil.Build(t, testutil.Spec{Compiler: spec.Compiler, Sources: []string{"lib.c"}, Shared: true, Profile: spec.Profile, NoInstr: spec.NoInstr,
		Name: "libfix.so", Flags: []string{"-Wl,-soname,libfix.so"}})
	spec.Sources = []string{"attach.c"}
	spec.LDFlags = []string{lib.Path, "-Wl,-rpath," + filepath.Dir(lib.Path), "-ldl"}
	return testutil.Build(t, spec).Path, lib.Path
}

// useRuntime points hotpatch at a runtime built for the test.
func useRuntime(t *testing.T) string {
	t.Helper()
	rt := testutil.Runtime(t, "gcc")
	t.Setenv(hotpatch.EnvRuntime, rt)
	return rt
}

func statsOf(t *testing.T, pid int) report.Stats {
	t.Helper()
	r := hotpatchOK(t, "stats", "--pid", fmt.Sprint(pid), "--json")
	var st report.Stats
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatalf("stats --json: %v\n%s", err, r.Stdout)
	}
	return st
}

func funcStats(st report.Stats, name string) report.FuncStats {
	for _, f := range st.Functions {
		if f.Name == name {
			return f
		}
	}
	return report.FuncStats{}
}

var loadedNote = regexp.MustCompile(`(?m)^loaded the edgeprobe runtime into pid (\d+)$`)

// TestInjectLive: a two-threaded program with a shared library, started
// without the runtime, gcc and clang, PIE and not, cyg and fentry. Enabling
// one function loads the runtime (one stderr line), stats show its calls
// with latency and no other function's, trace and profile record, disabling
// everything stops the counts, and the program's output equals an untouched
// run's.
func TestInjectLive(t *testing.T) {
	testutil.RequirePtrace(t)
	useRuntime(t)
	for _, cc := range []string{"gcc", "clang"} {
		for _, pie := range []bool{true, false} {
			for _, prov := range []string{"cyg", "fentry"} {
				spec := testutil.Spec{Compiler: cc, Opt: "-O2", PIE: testutil.Bool(pie)}
				if prov == "fentry" {
					spec.Profile, spec.NoInstr = testutil.ProfileFentry, true
				}
				t.Run(spec.String(), func(t *testing.T) {
					testutil.RequireTool(t, cc)
					bin := attachFixture(t, spec)
					want, _ := testutil.Start(t, nil, bin).Finish()

					p := testutil.Start(t, nil, bin)
					progress := p.Symbol(bin, "progress")
					pid := fmt.Sprint(p.Pid)
					// Not coldpatched: every probe starts on. Turning them off
					// needs no runtime, so nothing is loaded yet.
					r := hotpatchOK(t, "--pid", pid, "--disable", "*")
					if loadedNote.MatchString(r.Stderr) {
						t.Fatalf("disable loaded the runtime: %q", r.Stderr)
					}
					r = hotpatchOK(t, "--pid", pid, "--enable", "work")
					if m := loadedNote.FindStringSubmatch(r.Stderr); m == nil || m[1] != pid || strings.Count(r.Stderr, "\n") != 1 {
						t.Fatalf("enable: want exactly the line %q on stderr, got %q", "loaded the edgeprobe runtime into pid "+pid, r.Stderr)
					}
					p.AwaitProgress(progress, 20000)
					st := statsOf(t, p.Pid)
					w := funcStats(st, "work")
					if w.Entries == 0 || w.Exits == 0 || w.MeanNs == 0 || w.P99Ns == 0 {
						t.Fatalf("work after enable: %+v", w)
					}
					if l := funcStats(st, "lib_entry"); l.Entries != 0 {
						t.Fatalf("lib_entry recorded while off: %+v", l)
					}
					// A second command finds the runtime present: no note.
					r = hotpatchOK(t, "--pid", pid, "--enable", "work")
					if r.Stderr != "" {
						t.Fatalf("second enable: stderr %q", r.Stderr)
					}

					tr := hotpatchOK(t, "trace", "--pid", pid, "--enable", "lib_entry", "--duration", "5s", "--format", "text", "--max-calls", "200")
					if !strings.Contains(tr.Stdout, "lib_entry") {
						t.Fatalf("trace shows no lib_entry call:\n%.2000s", tr.Stdout)
					}
					prof := filepath.Join(t.TempDir(), "p.pprof")
					pr := hotpatchOK(t, "profile", "--pid", pid, "--enable", "lib_entry", "--duration", "300ms", "--epoch", "50ms", "--samples", "100", "-o", prof)
					m := regexp.MustCompile(`(\d+) probed calls`).FindStringSubmatch(pr.Stdout + pr.Stderr)
					if m == nil || m[1] == "0" {
						t.Fatalf("profile recorded nothing: %s%s", pr.Stdout, pr.Stderr)
					}
					if fi, err := os.Stat(prof); err != nil || fi.Size() == 0 {
						t.Fatalf("profile file: %v", err)
					}

					hotpatchOK(t, "--pid", pid, "--disable", "*")
					// Each worker finishes the calls it was in when the sites
					// went inert (a worker descheduled inside a hook records
					// that call late; the other worker alone can move the sum).
					workers := p.Symbol(bin, "worker_progress")
					p.AwaitProgress(workers, 2)
					p.AwaitProgress(workers+8, 2)
					before := funcStats(statsOf(t, p.Pid), "work")
					p.AwaitProgress(progress, 20000)
					after := funcStats(statsOf(t, p.Pid), "work")
					if after.Entries != before.Entries {
						t.Fatalf("work still counted after --disable '*': %d -> %d", before.Entries, after.Entries)
					}
					got, _ := p.Finish()
					if got != want || !strings.Contains(got, "wrong=0") {
						t.Fatalf("output %q, untouched run %q", got, want)
					}
				})
			}
		}
	}
}

var borrowedLine = regexp.MustCompile(`load: borrowed thread (\d+) \(system call (-?\d+)\)`)

// TestInjectHazards loads the runtime, again and again into fresh
// processes, while threads hammer malloc/free and dlopen/dlclose, one is
// blocked in read on a pipe fed in bursts and one sleeps in nanosleep:
// nothing deadlocks or crashes, every byte arrives in order, every sleep
// lasts its full time and returns 0 (the program checks and prints it), and
// the runtime records; a third of the loads borrow the reader itself, a
// third the sleeper. 20 repetitions; 100 with EDGEPROBE_LONG=1.
func TestInjectHazards(t *testing.T) {
	testutil.RequirePtrace(t)
	useRuntime(t)
	bin := attachFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	reps := 20
	if testutil.Long() {
		reps = 100
	}
	const want = "done wrong=0 pipe=ok short=0 eintr=0 signals=ok\n"
	borrowed := map[string]int{}
	for i := 0; i < reps; i++ {
		p := testutil.Start(t, nil, bin, "hazard")
		pid := fmt.Sprint(p.Pid)
		// A third of the loads borrow the reader (blocked in read), a third
		// the sleeper (in nanosleep), a third whichever thread is safe.
		t.Setenv(hotpatch.EnvInjectThread, []string{"reader", "sleeper", ""}[i%3])
		r := hotpatchOK(t, "--pid", pid, "--enable", "work", "-v")
		if !loadedNote.MatchString(r.Stderr) {
			t.Fatalf("rep %d: no load note: %q", i, r.Stderr)
		}
		if m := borrowedLine.FindStringSubmatch(r.Stderr); m != nil {
			borrowed[syscallName(m[2])]++
		}
		p.AwaitProgress(p.Symbol(bin, "progress"), 20000)
		if w := funcStats(statsOf(t, p.Pid), "work"); w.Entries == 0 {
			t.Fatalf("rep %d: the runtime recorded no call of work", i)
		}
		got, stderr := p.Finish()
		if got != want {
			t.Fatalf("rep %d: output %q (stderr %q), want %q", i, got, stderr, want)
		}
	}
	t.Logf("%d loads; the borrowed thread was in: %v", reps, borrowed)
}

func syscallName(nr string) string {
	switch nr {
	case "-1":
		return "no system call (program code)"
	case "0":
		return "read"
	case "35":
		return "nanosleep"
	case "230":
		return "clock_nanosleep"
	}
	return "system call " + nr
}

// hasRegion reports whether pid holds a runtime region (the runtime's memfd;
// any error but "no runtime" counts as one, to fail loudly).
func hasRegion(pid int) bool {
	r, err := shm.OpenPID(pid)
	if err == nil {
		r.Close()
		return true
	}
	return !errors.Is(err, shm.ErrNoRuntime)
}

// untouched asserts a refused load changed nothing: no runtime region, every
// probe in the state it had.
func untouched(t *testing.T, pid int, before []hotpatch.ProbeState, what string) {
	t.Helper()
	if hasRegion(pid) {
		t.Errorf("%s: the process has a runtime region", what)
	}
	after := probeStates(t, pid)
	if len(after) != len(before) {
		t.Fatalf("%s: %d probes, before %d", what, len(after), len(before))
	}
	for i := range after {
		if after[i].State != before[i].State {
			t.Errorf("%s: probe %d (%s) went %s -> %s", what, after[i].ID, after[i].Function, before[i].State, after[i].State)
		}
	}
}

func probeStates(t *testing.T, pid int) []hotpatch.ProbeState {
	t.Helper()
	r := hotpatchOK(t, "list", "--pid", fmt.Sprint(pid), "--json")
	var st []hotpatch.ProbeState
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatalf("list --json: %v\n%s", err, r.Stdout)
	}
	return st
}

// refused runs hotpatch, which must fail with exit 1 and a one-line error
// containing each of wants.
func refused(t *testing.T, env []string, args []string, wants ...string) {
	t.Helper()
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	r := testutil.Run(t, "hotpatch", args...)
	if r.Code != 1 || strings.Count(r.Stderr, "\n") != 1 || r.Stdout != "" {
		t.Fatalf("hotpatch %s: exit %d, stdout %q, stderr %q; want exit 1 and one line", strings.Join(args, " "), r.Code, r.Stdout, r.Stderr)
	}
	for _, w := range wants {
		if !strings.Contains(r.Stderr, w) {
			t.Fatalf("hotpatch %s: stderr %q does not say %q", strings.Join(args, " "), r.Stderr, w)
		}
	}
}

// TestInjectRefusals: each preflight refusal is one line, exit 1, and the
// process is left exactly as it was; --no-inject refuses instead of loading.
func TestInjectRefusals(t *testing.T) {
	testutil.RequirePtrace(t)
	rt := useRuntime(t)
	bin := attachFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})

	t.Run("no-inject", func(t *testing.T) {
		p := testutil.Start(t, nil, bin)
		pid := fmt.Sprint(p.Pid)
		hotpatchOK(t, "--pid", pid, "--disable", "*")
		before := probeStates(t, p.Pid)
		refused(t, nil, []string{"--pid", pid, "--enable", "work", "--no-inject"}, "was not started with the edgeprobe runtime", "--no-inject")
		refused(t, nil, []string{"stats", "--pid", pid, "--no-inject"}, "--no-inject")
		untouched(t, p.Pid, before, "--no-inject")
		p.Finish()
	})
	t.Run("seccomp", func(t *testing.T) {
		p := testutil.Start(t, nil, bin, "seccomp")
		pid := fmt.Sprint(p.Pid)
		hotpatchOK(t, "--pid", pid, "--disable", "*")
		before := probeStates(t, p.Pid)
		refused(t, nil, []string{"--pid", pid, "--enable", "work"}, "seccomp")
		untouched(t, p.Pid, before, "seccomp")
		if out, _ := p.Finish(); !strings.Contains(out, "wrong=0") {
			t.Fatalf("output %q", out)
		}
	})
	t.Run("static", func(t *testing.T) {
		fx := testutil.Build(t, testutil.Spec{Sources: []string{"mt.c"}, Static: true, PIE: testutil.Bool(false)})
		p := testutil.Start(t, nil, fx.Path)
		refused(t, nil, []string{"--pid", fmt.Sprint(p.Pid), "--enable", "work"}, "statically linked", "libedgeprobe.a", "--whole-archive")
		if hasRegion(p.Pid) {
			t.Error("a runtime region appeared")
		}
		p.Finish()
	})
	t.Run("untrusted", func(t *testing.T) {
		testutil.RequireRoot(t, "chown the runtime file to another user")
		p := testutil.Start(t, nil, bin)
		pid := fmt.Sprint(p.Pid)
		hotpatchOK(t, "--pid", pid, "--disable", "*")
		before := probeStates(t, p.Pid)
		data, err := os.ReadFile(rt)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		writable := filepath.Join(dir, "writable.so")
		os.WriteFile(writable, data, 0o644)
		os.Chmod(writable, 0o666)
		refused(t, nil, []string{"--pid", pid, "--enable", "work", "--runtime", writable}, "writable by group or others")
		other := testutil.OtherUser(t)
		foreign := filepath.Join(dir, "foreign.so")
		os.WriteFile(foreign, data, 0o644)
		if err := os.Chown(foreign, int(other.UID), int(other.GID)); err != nil {
			t.Fatal(err)
		}
		refused(t, []string{hotpatch.EnvRuntime + "=" + foreign}, []string{"--pid", pid, "--enable", "work"}, "neither root nor the target's owner")
		notRuntime := filepath.Join(dir, "libm.so")
		os.WriteFile(notRuntime, []byte("not an ELF file"), 0o644)
		refused(t, nil, []string{"--pid", pid, "--enable", "work", "--runtime", notRuntime}, "not an edgeprobe runtime")
		untouched(t, p.Pid, before, "untrusted runtime")
		p.Finish()
	})
	t.Run("own-hooks", func(t *testing.T) {
		hooks := hooksLib(t)
		p := testutil.Start(t, []string{"LD_PRELOAD=" + hooks}, bin)
		r := hotpatchOK(t, "--pid", fmt.Sprint(p.Pid), "--enable", "work", "-v")
		if loadedNote.MatchString(r.Stderr) || !strings.Contains(r.Stderr, "left alone: ") || !strings.Contains(r.Stderr, filepath.Base(hooks)) {
			t.Fatalf("a program with its own hooks: stderr %q", r.Stderr)
		}
		enters := p.Symbol(hooks, "enters")
		e0 := p.Read64(enters)
		p.AwaitProgress(p.Symbol(bin, "progress"), 20000)
		if p.Read64(enters) == e0 {
			t.Fatal("the program's own hooks stopped receiving calls")
		}
		if hasRegion(p.Pid) {
			t.Error("a runtime region appeared")
		}
		p.Finish()
	})
}

// TestInjectNamespace: a target in its own mount and pid namespace, with a
// private /tmp where the runtime file hotpatch reads does not exist (the
// program checks), and its own /proc: the runtime still loads (through the
// memfd), every slot is routed, and stats from outside shows its records.
func TestInjectNamespace(t *testing.T) {
	testutil.RequireRoot(t, "unshare a mount and a pid namespace")
	testutil.RequireTool(t, "unshare")
	testutil.RequirePtrace(t)
	bin, lib := attachFixtureLib(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	private, err := os.MkdirTemp("/tmp", "edgeprobe-rt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(private) })
	rt := testutil.CopyInto(t, testutil.Runtime(t, "gcc"), private)
	os.Chmod(rt, 0o644)
	t.Setenv(hotpatch.EnvRuntime, rt)
	// The program and its library go where both namespaces see them.
	stage, err := os.MkdirTemp("/dev/shm", "edgeprobe-ns-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(stage) })
	staged := testutil.CopyInto(t, bin, stage)
	testutil.CopyInto(t, lib, stage)
	stop := filepath.Join(stage, "stop")
	script := `mount -t tmpfs tmpfs /tmp && test ! -e "$1" && LD_LIBRARY_PATH="$2" exec "$4" "$3"`
	cmd := exec.Command("unshare", "-m", "-p", "--fork", "--kill-child", "--mount-proc", "sh", "-c", script, "sh", rt, stage, stop, staged)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := testutil.StartBound(cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	rd := bufio.NewReader(out)
	if line, err := rd.ReadString('\n'); err != nil || line != "ready 1\n" {
		t.Fatalf("in the namespace: %q, %v (stderr %q)", line, err, stderr.String())
	}
	kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(kids)))
	if err != nil {
		t.Fatalf("unshare's child: %q", kids)
	}
	r := hotpatchOK(t, "--pid", fmt.Sprint(pid), "--enable", "work")
	if m := loadedNote.FindStringSubmatch(r.Stderr); m == nil || m[1] != fmt.Sprint(pid) {
		t.Fatalf("enable: stderr %q", r.Stderr)
	}
	p, err := inject.Inspect(pid)
	if err != nil {
		t.Fatal(err)
	}
	if p.Runtime == nil || len(p.Slots) == 0 {
		t.Fatalf("after the load: runtime %v, %d slots", p.Runtime, len(p.Slots))
	}
	for _, s := range p.Slots {
		if s.State != inject.SlotRouted {
			t.Errorf("slot %s %s at %#x is %s", filepath.Base(s.Object), s.Hook, s.Addr, s.State)
		}
	}
	// stats from outside: the region is edgeprobe.1 in the namespace's
	// terms, found through the process's own mapping.
	deadline := time.Now().Add(time.Minute)
	for funcStats(statsOf(t, pid), "work").Entries == 0 {
		if time.Now().After(deadline) {
			t.Fatal("stats showed no call of work in a minute")
		}
	}
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(rd)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("namespace: %v (stderr %q)", err, stderr.String())
	}
	if string(rest) != "done wrong=0 pipe=ok short=0 eintr=0 signals=ok\n" {
		t.Fatalf("output %q", rest)
	}
}

// TestInjectRunningFrames: a call entered before the runtime was loaded and
// left after it (cyg: its exit hook reaches the runtime with no entry)
// is counted as an orphan exit, and nothing else goes wrong; the runtime
// counts the threads that existed before it (the workers) from their first
// hook.
func TestInjectRunningFrames(t *testing.T) {
	testutil.RequirePtrace(t)
	useRuntime(t)
	bin := attachFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	p := testutil.Start(t, nil, bin, "parked")
	pid := fmt.Sprint(p.Pid)
	// Every probe is on (not coldpatched): parked() entered through glibc's
	// hook. Enabling work loads the runtime while parked() is on the stack.
	r := hotpatchOK(t, "--pid", pid, "--enable", "work")
	if !loadedNote.MatchString(r.Stderr) {
		t.Fatalf("no load note: %q", r.Stderr)
	}
	if err := os.WriteFile(p.StopFile+".release", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	var f report.FuncStats
	for f.Exits == 0 {
		if time.Now().After(deadline) {
			t.Fatal("parked()'s exit was not recorded within a minute")
		}
		f = funcStats(statsOf(t, p.Pid), "parked")
	}
	if f.Entries != 0 || f.Exits != 1 || f.Orphans != 1 {
		t.Fatalf("parked(), entered before the load and left after it: %+v; want 0 entries, 1 exit, 1 orphan", f)
	}
	if w := funcStats(statsOf(t, p.Pid), "work"); w.Entries == 0 || w.Exits == 0 {
		t.Fatalf("work in the threads that existed before the load: %+v", w)
	}
	if out, _ := p.Finish(); !strings.Contains(out, "wrong=0") {
		t.Fatalf("output %q", out)
	}
}

// TestInjectFork: a child forked by a process after the runtime was loaded
// into it records on its own (the runtime's fork handlers, registered when
// it was loaded): its EDGEPROBE_OUTPUT file counts its 1000 calls of work.
func TestInjectFork(t *testing.T) {
	testutil.RequirePtrace(t)
	useRuntime(t)
	bin := attachFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	dir := t.TempDir()
	p := testutil.Start(t, []string{"EDGEPROBE_OUTPUT=" + filepath.Join(dir, "ep.%p")}, bin, "fork")
	pid := fmt.Sprint(p.Pid)
	hotpatchOK(t, "--pid", pid, "--disable", "*")
	if r := hotpatchOK(t, "--pid", pid, "--enable", "work"); !loadedNote.MatchString(r.Stderr) {
		t.Fatalf("no load note: %q", r.Stderr)
	}
	if err := os.WriteFile(p.StopFile+".release", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ := p.Finish()
	if !strings.Contains(out, "wrong=0") || !strings.Contains(out, "child exit=0") {
		t.Fatalf("output %q", out)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "ep.*"))
	var child string
	for _, f := range files {
		if filepath.Base(f) != "ep."+pid {
			child = f
		}
	}
	if len(files) != 2 || child == "" {
		t.Fatalf("output files %v: want the parent's (ep.%s) and the child's", files, pid)
	}
	r := hotpatchOK(t, "stats", "--input", child, "--json")
	var st report.Stats
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatal(err)
	}
	if w := funcStats(st, "work"); w.Entries != 1000 || w.Exits != 1000 {
		t.Fatalf("the child's work: %+v; want 1000 entries and exits", w)
	}
}

// TestInjectLateLibrary: an instrumented library the program dlopens after
// the runtime was loaded binds its hooks to glibc; the next hotpatch command
// that needs the runtime routes them (one stderr line saying so) and its
// calls are recorded.
func TestInjectLateLibrary(t *testing.T) {
	testutil.RequirePtrace(t)
	useRuntime(t)
	bin := attachFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	late := testutil.Build(t, testutil.Spec{Sources: []string{"lib.c"}, Shared: true, Name: "liblate.so", Flags: []string{"-Wl,-soname,liblate.so"}}).Path
	p := testutil.Start(t, nil, bin, "late", late)
	pid := fmt.Sprint(p.Pid)
	if r := hotpatchOK(t, "--pid", pid, "--enable", "work"); !loadedNote.MatchString(r.Stderr) {
		t.Fatalf("no load note: %q", r.Stderr)
	}
	if err := os.WriteFile(p.StopFile+".release", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Wait until the late library is mapped and its slots bound (to glibc).
	deadline := time.Now().Add(time.Minute)
	for {
		insp, err := inject.Inspect(p.Pid)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, s := range insp.Slots {
			if filepath.Base(s.Object) == "liblate.so" && s.State == inject.SlotGlibc {
				n++
			}
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("liblate.so's slots never bound to glibc: %+v", insp.Slots)
		}
	}
	r := hotpatchOK(t, "--pid", pid, "--enable", "lib_entry")
	if !regexp.MustCompile(`^routed \d+ hook slots of pid ` + pid + ` to its edgeprobe runtime\n$`).MatchString(r.Stderr) {
		t.Fatalf("second enable: stderr %q", r.Stderr)
	}
	insp, err := inject.Inspect(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range insp.Slots {
		if s.State != inject.SlotRouted {
			t.Errorf("slot %s %s is %s", filepath.Base(s.Object), s.Hook, s.State)
		}
	}
	deadline = time.Now().Add(time.Minute)
	for {
		// lib_hidden: liblate.so's lib_entry hands its hooks the address
		// of the lib_entry that interposes it (libfix.so's, loaded first),
		// as default-visibility symbols are bound; a hidden one is its own.
		var late uint64
		for _, f := range statsOf(t, p.Pid).Functions {
			if f.Name == "lib_hidden" && filepath.Base(f.Object) == "liblate.so" {
				late += f.Entries
			}
		}
		if late > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no call of liblate.so's lib_hidden recorded in a minute")
		}
	}
	if out, _ := p.Finish(); !strings.Contains(out, "wrong=0") {
		t.Fatalf("output %q", out)
	}
}

// TestRefusedBeforeLoad: a request refused for what it asks (a name that
// matches nothing, a malformed --probes file, a list of another program, a
// trace or profile of a name that matches nothing, a session command that
// matches nothing) is refused before the runtime is
// loaded: one line, its exit code, no "loaded" line, no region, every probe
// as it was. Before, each of them loaded the runtime (and rerouted the
// hook slots), said so, and only then refused.
func TestRefusedBeforeLoad(t *testing.T) {
	testutil.RequirePtrace(t)
	useRuntime(t)
	bin := attachFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	p := testutil.Start(t, nil, bin)
	pid := fmt.Sprint(p.Pid)
	before := probeStates(t, p.Pid)
	dir := t.TempDir()
	malformed := filepath.Join(dir, "malformed.json")
	if err := os.WriteFile(malformed, []byte(`{"format":"edgeprobe-probes","version":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	otherBin := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"basic.c"}}).Path
	otherList := filepath.Join(dir, "other.json")
	if err := os.WriteFile(otherList, []byte(testutil.RunOK(t, "coldpatch", otherBin).Stdout), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"--pid", pid, "--enable", "no_such_function"}, 3, "no probe matched"},
		{[]string{"--pid", pid, "--probes", malformed, "--enable", "work"}, 1, "invalid probe list"},
		{[]string{"--pid", pid, "--probes", otherList, "--enable", "*"}, 1, "no mapped object has build-id"},
		{[]string{"trace", "--pid", pid, "--enable", "no_such_function", "--duration", "1s", "-o", filepath.Join(dir, "t.json")}, 3, "no probe matched"},
		{[]string{"profile", "--pid", pid, "--enable", "no_such_function", "--duration", "1s", "-o", filepath.Join(dir, "p.pprof")}, 3, "no probe matched"},
	} {
		r := testutil.Run(t, "hotpatch", c.args...)
		if r.Code != c.code || strings.Count(r.Stderr, "\n") != 1 || !strings.Contains(r.Stderr, c.says) {
			t.Errorf("hotpatch %s: exit %d, stderr %q; want exit %d and one line saying %q", strings.Join(c.args, " "), r.Code, r.Stderr, c.code, c.says)
		}
		if hasRegion(p.Pid) {
			t.Fatalf("hotpatch %s, refused, loaded the runtime (stderr %q)", strings.Join(c.args, " "), r.Stderr)
		}
	}
	cmd := exec.Command(testutil.Command(t, "hotpatch"), "session", "--pid", pid)
	cmd.Stdin = strings.NewReader("enable no_such_function\n")
	out, err := testutil.OutputBound(cmd)
	if err != nil || !strings.Contains(string(out), `"ok":false`) || !strings.Contains(string(out), "no probe matched") {
		t.Errorf("session: %v, %q; want the command refused as matching nothing", err, out)
	}
	if hasRegion(p.Pid) {
		t.Fatalf("a session command that matched nothing loaded the runtime (%q)", out)
	}
	untouched(t, p.Pid, before, "refused requests")
	// What they were refused for, not the process: a good one loads.
	if r := hotpatchOK(t, "--pid", pid, "--enable", "work"); !loadedNote.MatchString(r.Stderr) {
		t.Fatalf("enable work: stderr %q, want the runtime loaded", r.Stderr)
	}
	p.Finish()
}

// TestLoadFailureMessage: a load whose dlopen fails in the target reports
// dlopen's own message. The runtime here defines the four hooks (so it is
// taken as one) but needs a symbol nothing defines: dlopen (RTLD_NOW)
// says "undefined symbol: edgeprobe_review5_missing". Before, hotpatch read
// dlerror()'s string after the loader thread had exited, and glibc frees a
// thread's dlerror buffer at its exit: the message read back was empty
// ("pid N: : loading the runtime failed").
func TestLoadFailureMessage(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireTool(t, "gcc")
	dir := t.TempDir()
	src := filepath.Join(dir, "bad.c")
	if err := os.WriteFile(src, []byte(`
extern void edgeprobe_review5_missing(void);
void __cyg_profile_func_enter(void *f, void *c) { (void)f; (void)c; edgeprobe_review5_missing(); }
void __cyg_profile_func_exit(void *f, void *c) { (void)f; (void)c; }
void __cyg_profile_func_enter_bare(void) {}
void __fentry__(void) {}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	rt := filepath.Join(dir, "libbad.so")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-O2", src, "-o", rt).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	bin := attachFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	p := testutil.Start(t, nil, bin)
	before := probeStates(t, p.Pid)
	refused(t, nil, []string{"--pid", fmt.Sprint(p.Pid), "--enable", "work", "--runtime", rt}, "undefined symbol: edgeprobe_review5_missing", "loading the runtime failed")
	untouched(t, p.Pid, before, "failed dlopen")
	p.Finish()
}
