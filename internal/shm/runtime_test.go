package shm

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

func TestRuntimeBuildsWarningFree(t *testing.T) {
	for _, cc := range []string{"gcc", "clang"} {
		t.Run(cc, func(t *testing.T) {
			lib := buildRuntime(t, cc) // -Wall -Wextra -Werror
			testutil.RequireTool(t, "nm")
			out, err := exec.Command("nm", "-D", "--defined-only", lib).Output()
			if err != nil {
				t.Fatalf("nm -D %s: %v", lib, err)
			}
			// Every defined dynamic symbol, functions and data: the runtime's
			// files share their names hidden (D17), so only the hooks show,
			// and the weak prctl/syscall interposers that turn the hooks'
			// string copies off when the program enters seccomp
			// (edgeprobe_seccomp.c), and the weak swapcontext that carries a
			// coroutine's frames with it (edgeprobe_ctx.c, D102).
			var exported []string
			for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				if f := strings.Fields(l); len(f) == 3 {
					exported = append(exported, f[1]+" "+f[2])
				}
			}
			want := "T __cyg_profile_func_enter, T __cyg_profile_func_enter_bare, T __cyg_profile_func_exit, T __fentry__, W prctl, W swapcontext, W syscall"
			if got := strings.Join(exported, ", "); got != want {
				t.Errorf("exported symbols %q, want only the hooks and interposers %q", got, want)
			}
		})
	}
}

// TestExactCounts runs the deterministic multi-threaded fixture under the
// runtime and checks every function's entry and exit counts, for both
// compilers, with the per-thread counter cache on and off and in count-only
// mode.
func TestExactCounts(t *testing.T) {
	const k = 2000
	for _, cc := range []string{"gcc", "clang"} {
		for _, opt := range []string{"-O0", "-O2"} {
			t.Run(cc+opt, func(t *testing.T) {
				lib := buildRuntime(t, cc)
				bin, libdir := buildCounts(t, cc, opt)
				ldp := "LD_LIBRARY_PATH=" + libdir
				plain := mustRun(t, "", bin, []string{ldp}, strconv.Itoa(k))
				for _, mode := range []struct {
					name string
					env  []string
				}{
					{"default", nil},
					{"shared-counters", []string{"EDGEPROBE_LOCAL_FUNCS=0"}},
					{"count-only", []string{"EDGEPROBE_TIMING=0"}},
					{"mono-clock", []string{"EDGEPROBE_CLOCK=mono"}},
					// Caches so small that functions share a home (D98):
					// the hooks' fast paths must decline an entry that is
					// not the function's, and an exit must count in the
					// entry its frame names, wherever the C put it.
					{"two-entry-cache", []string{"EDGEPROBE_LOCAL_FUNCS=2"}},
					{"two-entry-cache-count-only", []string{"EDGEPROBE_LOCAL_FUNCS=2", "EDGEPROBE_TIMING=0"}},
				} {
					t.Run(mode.name, func(t *testing.T) {
						out := filepath.Join(t.TempDir(), "out")
						env := append([]string{ldp, "EDGEPROBE_OUTPUT=" + out}, mode.env...)
						got := mustRun(t, lib, bin, env, strconv.Itoa(k))
						if got != plain {
							t.Errorf("output under the runtime %q, without %q", got, plain)
						}
						r := openOutput(t, out)
						h := r.Header()
						if !r.Exited() || h.Pid <= 0 || r.Maps() == nil {
							t.Fatalf("output file: exited %v pid %d maps %d bytes", r.Exited(), h.Pid, len(r.Maps()))
						}
						noShm(t, int(h.Pid)) // nothing in /dev/shm
						funcs := byName(t, r, r.Maps())
						want := countsWant(k)
						if cc == "clang" && opt != "-O0" {
							// glibc's extern-inline atol, inlined into main, is
							// instrumented by clang with the address of libc's atol.
							want["atol"] = ee{1, 1}
						}
						checkCounts(t, funcs, want)
						c := r.Counters()
						if c.Orphans+c.Unmatched+c.FuncDropEnters+c.FuncDropExits+c.ThreadDropHits+c.PreinitDrops+c.LateDrops+c.StackOverflows+c.ReentrantDrops != 0 {
							t.Errorf("unexpected drops or mismatches: %+v", c)
						}
						if c.ThreadsClaimed != 5 || c.ThreadsActive != 1 {
							t.Errorf("threads claimed/active = %d/%d, want 5/1 (main keeps its slot)", c.ThreadsClaimed, c.ThreadsActive)
						}
						f := funcs["f"]
						timed := !strings.HasSuffix(mode.name, "count-only")
						if timed {
							if f.Samples != f.Exits || f.MinNs > f.MaxNs || f.MaxNs == 0 {
								t.Errorf("f latency: samples %d (exits %d) min %d max %d", f.Samples, f.Exits, f.MinNs, f.MaxNs)
							}
							p50, p99 := f.Percentile(0.5), f.Percentile(0.99)
							if p50 < f.MinNs || p50 > p99 || p99 > f.MaxNs {
								t.Errorf("f percentiles p50 %d p99 %d outside [%d, %d]", p50, p99, f.MinNs, f.MaxNs)
							}
							// rec's outer call includes the 12 nested ones.
							if rec := funcs["rec"]; rec.MaxNs < funcs["g"].MinNs {
								t.Errorf("rec max %d < g min %d", rec.MaxNs, funcs["g"].MinNs)
							}
						} else if f.Samples != 0 || f.SumNs != 0 {
							t.Errorf("count-only mode recorded latency: %+v", f)
						}
						if mode.name == "shared-counters" && h.LocalFuncs != 0 {
							t.Errorf("EDGEPROBE_LOCAL_FUNCS=0 gave local_funcs %d", h.LocalFuncs)
						}
						if mode.name == "mono-clock" && h.ClockKind != ClockMono {
							t.Errorf("EDGEPROBE_CLOCK=mono gave clock %d", h.ClockKind)
						}
					})
				}
			})
		}
	}
}

// TestBareHook: clang's -finstrument-function-entry-bare calls a hook with
// no arguments; the runtime keys it by return address.
func TestBareHook(t *testing.T) {
	testutil.RequireTool(t, "clang")
	lib := buildRuntime(t, "clang")
	bin := testutil.Build(t, testutil.Spec{Compiler: "clang", Sources: []string{"counts.c", "lib.c"}, NoInstr: true,
		// glibc has no __cyg_profile_func_enter_bare: link the runtime itself.
		Flags: []string{"-finstrument-function-entry-bare"}, LDFlags: []string{lib}, Name: "counts-bare"}).Path
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, lib, bin, []string{"EDGEPROBE_OUTPUT=" + out}, "100")
	r := openOutput(t, out)
	funcs := byName(t, r, r.Maps())
	for name, w := range map[string]uint64{"main": 1, "worker": 4, "f": 400, "g": 400, "add": 200, "mul": 200, "rec": 52} {
		f := funcs[name]
		if !f.Bare || f.Entries != w || f.Exits != 0 {
			t.Errorf("%s: bare %v entries %d exits %d, want bare entries %d", name, f.Bare, f.Entries, f.Exits, w)
		}
	}
}

func TestLongjmpUnmatched(t *testing.T) {
	for _, cc := range []string{"gcc", "clang"} {
		t.Run(cc, func(t *testing.T) {
			lib := buildRuntime(t, cc)
			bin := testutil.Build(t, testutil.Spec{Compiler: cc, Sources: []string{"longjmp.c"}}).Path
			out := filepath.Join(t.TempDir(), "out")
			mustRun(t, lib, bin, []string{"EDGEPROBE_OUTPUT=" + out})
			r := openOutput(t, out)
			funcs := byName(t, r, r.Maps())
			checkCounts(t, funcs, map[string]ee{"main": {1, 1}, "catcher": {1, 1}, "deep": {4, 0}})
			if d, c := funcs["deep"], funcs["catcher"]; d.Unmatched != 4 || c.Unmatched != 0 {
				t.Errorf("unmatched: deep %d, catcher %d; want 4, 0", d.Unmatched, c.Unmatched)
			}
			if c := r.Counters(); c.Unmatched != 4 || c.Orphans != 0 {
				t.Errorf("counters: unmatched %d orphans %d, want 4, 0", c.Unmatched, c.Orphans)
			}
			if c := funcs["catcher"]; c.Samples != 1 {
				t.Errorf("catcher not timed after the mismatch: %+v", c)
			}
		})
	}
}

func TestSignalReentrancy(t *testing.T) {
	const n = 5000
	lib := buildRuntime(t, "gcc")
	bin := testutil.Build(t, testutil.Spec{Sources: []string{"sig.c"}}).Path
	out := filepath.Join(t.TempDir(), "out")
	got := mustRun(t, lib, bin, []string{"EDGEPROBE_OUTPUT=" + out}, strconv.Itoa(n))
	if got != fmt.Sprintf("signals %d\n", n) {
		t.Fatalf("fixture output %q", got)
	}
	r := openOutput(t, out)
	funcs := byName(t, r, r.Maps())
	c := r.Counters()
	onSig, leaf := funcs["on_sig"], funcs["sig_leaf"]
	if onSig.Entries != onSig.Exits || leaf.Entries != onSig.Entries || leaf.Exits != leaf.Entries {
		t.Errorf("handler hooks not paired: on_sig %d/%d sig_leaf %d/%d", onSig.Entries, onSig.Exits, leaf.Entries, leaf.Exits)
	}
	if c.ReentrantDrops%4 != 0 || onSig.Entries+c.ReentrantDrops/4 != n {
		t.Errorf("on_sig entries %d + reentrant drops %d/4 != %d signals", onSig.Entries, c.ReentrantDrops, n)
	}
	if c.ReentrantDrops == 0 {
		t.Errorf("no signal landed inside a hook in %d tries: the guard was not exercised", n)
	}
	if c.Orphans+c.Unmatched != 0 {
		t.Errorf("mismatches: %+v", c)
	}
	t.Logf("%d of %d handler runs dropped as reentrant", c.ReentrantDrops/4, n)
}

func TestTableFull(t *testing.T) {
	lib := buildRuntime(t, "gcc")
	bin, libdir := buildCounts(t, "gcc", "-O2")
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, lib, bin, []string{"LD_LIBRARY_PATH=" + libdir, "EDGEPROBE_OUTPUT=" + out, "EDGEPROBE_MAX_FUNCS=4"}, "100")
	r := openOutput(t, out)
	funcs := r.Functions()
	c := r.Counters()
	if len(funcs) > 4 || c.FuncsUsed != uint64(len(funcs)) || c.FuncDropEnters == 0 {
		t.Fatalf("%d functions recorded, funcs_used %d, drops %d: want <= 4 and drops counted", len(funcs), c.FuncsUsed, c.FuncDropEnters)
	}
	var entries, exits uint64
	for _, f := range funcs {
		entries += f.Entries
		exits += f.Exits
	}
	var want uint64
	for _, w := range countsWant(100) {
		want += w.entries
	}
	if entries+c.FuncDropEnters != want || exits+c.FuncDropExits != want {
		t.Errorf("recorded+dropped enters %d+%d, exits %d+%d, want %d each", entries, c.FuncDropEnters, exits, c.FuncDropExits, want)
	}
}

func TestThreadOverflow(t *testing.T) {
	lib := buildRuntime(t, "gcc")
	bin, libdir := buildCounts(t, "gcc", "-O2")
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, lib, bin, []string{"LD_LIBRARY_PATH=" + libdir, "EDGEPROBE_OUTPUT=" + out, "EDGEPROBE_MAX_THREADS=1"}, "100")
	r := openOutput(t, out)
	c := r.Counters()
	// main claims the only slot at its first hook and never releases it.
	if c.ThreadOverflows != 4 || c.ThreadsClaimed != 1 {
		t.Errorf("thread overflows %d claimed %d, want 4, 1", c.ThreadOverflows, c.ThreadsClaimed)
	}
	funcs := byName(t, r, r.Maps())
	checkCounts(t, funcs, map[string]ee{"main": {1, 1}, "lib_entry": {10, 10}, "lib_hidden": {10, 10}, "lib_static": {10, 10}})
	// Each worker runs 1 + 2k + k + 13 calls, two hooks each.
	if want := uint64(4 * 2 * (1 + 3*100 + 13)); c.ThreadDropHits != want {
		t.Errorf("dropped hooks of slotless threads = %d, want %d", c.ThreadDropHits, want)
	}
}

func TestTraceEvents(t *testing.T) {
	const k = 50
	lib := buildRuntime(t, "gcc")
	bin, libdir := buildCounts(t, "gcc", "-O2")
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, lib, bin, []string{"LD_LIBRARY_PATH=" + libdir, "EDGEPROBE_OUTPUT=" + out, "EDGEPROBE_TRACE=1", "EDGEPROBE_RING_EVENTS=4096"}, strconv.Itoa(k))
	r := openOutput(t, out)
	h := r.Header()
	sym := newSymbolizer(t, r.Maps())
	enters := map[string]uint64{}
	for _, th := range r.Threads() {
		evs, err := r.Events(th.Index)
		if err != nil {
			t.Fatal(err)
		}
		if th.RingDropped != 0 || uint64(len(evs)) != th.RingHead {
			t.Fatalf("slot %d: %d events, head %d, dropped %d", th.Index, len(evs), th.RingHead, th.RingDropped)
		}
		if len(evs) == 0 || evs[0].Kind != EvThread || int32(evs[0].Addr) != th.Tid {
			t.Fatalf("slot %d: first event %+v, want the thread marker for tid %d", th.Index, evs[0], th.Tid)
		}
		var stack []uint64
		last := h.Mono0
		for _, e := range evs[1:] {
			if e.TimeNs < last || e.TimeNs > h.ExitMono {
				t.Fatalf("slot %d: event time %d outside [%d, %d]", th.Index, e.TimeNs, last, h.ExitMono)
			}
			last = e.TimeNs
			switch e.Kind {
			case EvEnter:
				stack = append(stack, e.Addr)
				name, _ := sym.name(e.Addr, false)
				enters[name]++
			case EvExit:
				if len(stack) == 0 || stack[len(stack)-1] != e.Addr {
					t.Fatalf("slot %d: exit %#x does not match the open frame", th.Index, e.Addr)
				}
				stack = stack[:len(stack)-1]
			default:
				t.Fatalf("slot %d: unexpected event %+v", th.Index, e)
			}
		}
		if len(stack) != 0 {
			t.Errorf("slot %d: %d frames left open", th.Index, len(stack))
		}
	}
	for name, w := range countsWant(k) {
		if enters[name] != w.entries {
			t.Errorf("%s: %d enter events, want %d", name, enters[name], w.entries)
		}
	}
}

func TestRingOverflowCounted(t *testing.T) {
	const k = 100
	lib := buildRuntime(t, "gcc")
	bin, libdir := buildCounts(t, "gcc", "-O2")
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, lib, bin, []string{"LD_LIBRARY_PATH=" + libdir, "EDGEPROBE_OUTPUT=" + out, "EDGEPROBE_TRACE=1", "EDGEPROBE_RING_EVENTS=8"}, strconv.Itoa(k))
	r := openOutput(t, out)
	var total uint64
	for _, th := range r.Threads() {
		evs, _ := r.Events(th.Index)
		if th.RingHead != 8 || len(evs) != 8 || th.RingDropped == 0 {
			t.Errorf("slot %d: head %d, %d events, dropped %d; want a full ring of 8 and drops", th.Index, th.RingHead, len(evs), th.RingDropped)
		}
		total += th.RingHead + th.RingDropped
	}
	var calls uint64
	for _, w := range countsWant(k) {
		calls += w.entries
	}
	// every hook is an event, plus one thread marker per claim
	if want := 2*calls + r.Counters().ThreadsClaimed; total != want {
		t.Errorf("events written+dropped = %d, want %d", total, want)
	}
}

func TestForkAndExec(t *testing.T) {
	for _, mode := range []string{"fork", "exec"} {
		t.Run(mode, func(t *testing.T) {
			lib := buildRuntime(t, "gcc")
			bin := testutil.Build(t, testutil.Spec{Sources: []string{"forkexec.c"}}).Path
			p, c := runForked(t, lib, bin, mode)
			checkCounts(t, byName(t, p, p.Maps()), map[string]ee{"main": {1, 1}, "parent_work": {3, 3}, "do_fork": {1, 1}, "parent_after": {2, 2}})
			cf := byName(t, c, c.Maps())
			if mode == "fork" {
				checkCounts(t, cf, map[string]ee{"do_fork": {0, 1}, "child_work": {5, 5}})
				if cf["do_fork"].Orphans != 1 {
					t.Errorf("child do_fork orphans %d, want 1", cf["do_fork"].Orphans)
				}
			} else {
				checkCounts(t, cf, map[string]ee{"main": {1, 1}, "exec_work": {4, 4}})
			}
			noShm(t, int(c.Header().Pid))
			noShm(t, int(p.Header().Pid))
		})
	}
}

// TestLiveRead attaches to a running mt.c, watches counts grow, switches
// tracing on through the control word and consumes events, then stops it.
func TestLiveRead(t *testing.T) {
	lib := buildRuntime(t, "gcc")
	bin := testutil.Build(t, testutil.Spec{Sources: []string{"mt.c"}}).Path
	stop := filepath.Join(t.TempDir(), "stop")
	cmd := exec.Command(bin, stop)
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib, "EDGEPROBE_RING_EVENTS=1024")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := testutil.StartBound(cmd); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(stdout)
	var pid int
	if !sc.Scan() {
		t.Fatalf("no ready line: %v", sc.Err())
	}
	if _, err := fmt.Sscanf(sc.Text(), "ready %d", &pid); err != nil || pid != cmd.Process.Pid {
		t.Fatalf("ready line %q (pid %d)", sc.Text(), cmd.Process.Pid)
	}
	// "ready" is printed once all workers run, and each worker's first hook
	// creates (or finds) the region before it counts as running.
	r, err := OpenPID(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Exited() || int(r.Header().Pid) != pid || !r.Writable() {
		t.Fatalf("live region: exited %v pid %d writable %v", r.Exited(), r.Header().Pid, r.Writable())
	}
	procMaps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	work := func() uint64 { return byName(t, r, procMaps)["work"].Entries }
	first := work()
	for work() <= first {
		if time.Now().After(deadline) {
			t.Fatal("work() entries do not grow")
		}
	}
	if err := r.SetTrace(true); err != nil {
		t.Fatal(err)
	}
	sym := newSymbolizer(t, procMaps)
	seen := map[string]int{}
	for seen["work"] == 0 || seen["leaf"] == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no work/leaf events consumed: %v", seen)
		}
		for _, th := range r.Threads() {
			if _, err := r.Consume(th.Index, func(e Event) {
				if name, ok := sym.name(e.Addr, false); ok && e.Kind != EvThread {
					seen[name]++
				}
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := r.SetTrace(false); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for sc.Scan() {
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("mt: %v\n%s", err, stderr.String())
	}
	if !r.Exited() {
		t.Error("region not marked exited")
	}
	if c := r.Counters(); c.ThreadsActive != 1 || c.Orphans != 0 {
		t.Errorf("after exit: %+v", c)
	}
	noShm(t, pid)
	t.Logf("consumed events: %v", seen)
}

// TestNoRegionNoCrash: when the region cannot be made the program still runs
// unchanged, and the runtime says why on stderr once.
func TestNoRegionNoCrash(t *testing.T) {
	lib := buildRuntime(t, "gcc")
	bin := testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}}).Path
	plain := mustRun(t, "", bin, nil)
	// Limits whose region would exceed the runtime's cap.
	huge := []string{"EDGEPROBE_MAX_THREADS=65536", "EDGEPROBE_STACK_DEPTH=65536"}
	res := runWith(t, lib, bin, huge)
	if res.err != nil || res.stdout != plain {
		t.Fatalf("under a failing runtime: %v, output %q want %q", res.err, res.stdout, plain)
	}
	if strings.Count(res.stderr, "edgeprobe:") != 1 {
		t.Errorf("stderr %q, want one edgeprobe message", res.stderr)
	}
	res = runWith(t, lib, bin, append(huge, "EDGEPROBE_QUIET=1"))
	if res.stderr != "" {
		t.Errorf("EDGEPROBE_QUIET=1 still wrote %q", res.stderr)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	os.WriteFile(short, make([]byte, 100), 0o600)
	if _, err := Open(short); !errors.Is(err, ErrTruncated) {
		t.Errorf("short file: %v", err)
	}
	zero := filepath.Join(dir, "zero")
	os.WriteFile(zero, make([]byte, 8192), 0o600)
	if _, err := Open(zero); !errors.Is(err, ErrBadMagic) || !strings.Contains(err.Error(), zero) {
		t.Errorf("zero file: %v", err)
	}
	if _, err := OpenPID(1 << 30); !errors.Is(err, os.ErrNotExist) || !errors.Is(err, ErrNoRuntime) {
		t.Errorf("missing pid: %v", err)
	}
}
