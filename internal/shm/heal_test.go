package shm

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// Self-healing call tracking: frames abandoned by longjmp, siglongjmp out of
// a signal handler, exceptions or probes toggled mid-call are found dead at a
// later hook, counted, and never keep the thread from recording
// (testdata/fixtures/heal.c).

// balanced fails the test for every function whose tracked entries are not
// accounted for exactly (Func.Balanced) or that still has open frames.
func balanced(t testing.TB, funcs map[string]Func, open bool) {
	t.Helper()
	for name, f := range funcs {
		if !f.Balanced() || (!open && f.Open != 0) {
			t.Errorf("%s: entries %d (deep %d) != exits %d - orphans %d - deep exits %d + unmatched %d + open %d",
				name, f.Entries, f.DeepEntries, f.Exits, f.Orphans, f.DeepExits, f.Unmatched, f.Open)
		}
	}
}

// timingMode is the runtime's clock setting a healing test runs under: the
// hooks take a different fast path when they only count (D79), so the frames
// they push and pop are checked in both (D85).
type timingMode struct {
	suffix string
	env    []string
	want   string // what allTimed checks, for messages
	clock  bool
}

var (
	timed     = timingMode{suffix: "", want: "all timed", clock: true}
	countOnly = timingMode{suffix: "-countonly", env: []string{"EDGEPROBE_TIMING=0"}, want: "none timed (counting only)"}
)

// allTimed: under the clock every one of f's n calls has a latency; counting
// only, none has.
func (m timingMode) allTimed(f Func, n uint64) bool {
	if m.clock {
		return f.Samples == n && f.SumNs != 0
	}
	return f.Samples == 0 && f.SumNs == 0
}

func buildHeal(t testing.TB, cc, opt string, fentry bool) string {
	t.Helper()
	spec := testutil.Spec{Compiler: cc, Opt: opt, Sources: []string{"heal.c"}, LDFlags: []string{"-ldl"},
		Name: fmt.Sprintf("heal-%s%s-fentry%v", cc, opt, fentry)}
	if fentry {
		spec.NoInstr = true
		spec.Profile = testutil.ProfileFentry
	}
	return testutil.Build(t, spec).Path
}

// TestLongjmpFromDeepRecursion: longjmp out of 301 frames (more than the
// 256-frame shadow stack) and then 100,000 calls of a leaf. Before the
// stack healed by position, the depth never came back down and every later
// call was counted but not timed. Also out of 101 frames, all within the
// stack: leaf() is called once before the dive, so its next enter takes the
// hooks' fast path, which must find them dead (and leave them to the C), in
// each of its bodies (timed, counting only).
func TestLongjmpFromDeepRecursion(t *testing.T) {
	const k = 100000
	for _, b := range []struct {
		cc, opt string
		fentry  bool
		mode    timingMode
		n       int
	}{{"gcc", "-O0", false, timed, 300}, {"gcc", "-O2", false, timed, 300}, {"clang", "-O2", false, timed, 300},
		{"gcc", "-O2", true, timed, 300}, {"clang", "-O2", true, timed, 300},
		{"gcc", "-O2", false, countOnly, 300}, {"clang", "-O2", false, countOnly, 300},
		{"gcc", "-O2", false, timed, 100}, {"gcc", "-O2", false, countOnly, 100}, {"clang", "-O2", false, countOnly, 100}} {
		n := uint64(b.n)
		t.Run(fmt.Sprintf("%s%s-fentry%v%s-%d", b.cc, b.opt, b.fentry, b.mode.suffix, b.n), func(t *testing.T) {
			lib := buildRuntime(t, b.cc)
			bin := buildHeal(t, b.cc, b.opt, b.fentry)
			out := filepath.Join(t.TempDir(), "out")
			mustRun(t, lib, bin, append([]string{"EDGEPROBE_OUTPUT=" + out}, b.mode.env...), "deep", strconv.Itoa(b.n), strconv.Itoa(k))
			r := openOutput(t, out)
			funcs := byName(t, r, r.Maps())
			leaf, dive := funcs["leaf"], funcs["dive"]
			if leaf.Entries != k+1 || leaf.Exits != k+1 || !b.mode.allTimed(leaf, k+1) {
				t.Errorf("leaf: %d/%d calls, %d timed, total %d ns; want %d/%d, %s", leaf.Entries, leaf.Exits, leaf.Samples, leaf.SumNs, k+1, k+1, b.mode.want)
			}
			if dive.Entries != n+1 || dive.Exits != 0 {
				t.Errorf("dive: %d/%d calls, want %d/0", dive.Entries, dive.Exits, n+1)
			}
			c := r.Counters()
			// Frames beyond the shadow stack: counted per function as untimed
			// entries, and as lost frames of the thread once found dead.
			// (fentry: frames beyond the return-address stack get no exit
			// probe, so there is no frame to lose.)
			wantLost := dive.DeepEntries
			if b.fentry {
				wantLost = 0
			}
			beyond := b.n >= 256
			if dive.Unmatched+dive.DeepEntries != n+1 || (dive.DeepEntries != 0) != beyond || c.DeepLost != wantLost {
				t.Errorf("dive: unmatched %d + deep %d != %d, thread deep_lost %d", dive.Unmatched, dive.DeepEntries, n+1, c.DeepLost)
			}
			if c.Orphans != 0 || c.AbandonedHooks != 0 {
				t.Errorf("counters %+v: want no orphans", c)
			}
			balanced(t, funcs, false)
		})
	}
}

// TestLongjmpHealedLive: the same jump out of 101 frames, read live while the
// fixture waits. The final counts cannot tell when the dead frames were found
// (a later exit, or the thread's end, counts them too), the live region can:
// the leaf's first enter after the jump, a fast-path one, must have found
// them dead, in each of the fast path's bodies (timed, counting only).
func TestLongjmpHealedLive(t *testing.T) {
	const n, k = 100, 1000
	for _, b := range []struct {
		cc   string
		mode timingMode
	}{{"gcc", timed}, {"gcc", countOnly}, {"clang", countOnly}} {
		t.Run(b.cc+b.mode.suffix, func(t *testing.T) {
			lib := buildRuntime(t, b.cc)
			bin := buildHeal(t, b.cc, "-O2", false)
			p := testutil.Start(t, append([]string{"LD_PRELOAD=" + lib}, b.mode.env...), bin, "deepwait", strconv.Itoa(n), strconv.Itoa(k))
			r, err := OpenPID(p.Pid)
			if err != nil {
				t.Fatal(err)
			}
			maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", p.Pid))
			if err != nil {
				t.Fatal(err)
			}
			funcs := byName(t, r, maps)
			r.Close()
			dive, leaf := funcs["dive"], funcs["leaf"]
			// The outermost dive frame was entered at the position the leaf's
			// hooks run at (both are called by the same function), from
			// another site: to the hooks it may be a caller inlined there, so
			// it stays open until that function's exit (docs/runtime.md,
			// "An enter heals the stack"). The n frames below it are dead.
			if dive.Entries != n+1 || dive.Unmatched != n || dive.Open != 1 {
				t.Errorf("dive live: %d entries, %d unmatched, %d open; want %d found dead, 1 open", dive.Entries, dive.Unmatched, dive.Open, n)
			}
			if leaf.Entries != k+1 || leaf.Exits != k+1 || leaf.Open != 0 || !b.mode.allTimed(leaf, k+1) {
				t.Errorf("leaf live: %d/%d calls, %d open, %d timed; want %d, %s", leaf.Entries, leaf.Exits, leaf.Open, leaf.Samples, k+1, b.mode.want)
			}
			p.Finish()
		})
	}
}

// TestSigLongjmpOutOfHooks: a SIGUSR1 handler that lands in the runtime's
// code siglongjmps out of it, 200 times; the handler runs probed code itself.
// Afterwards 1,000,000 calls are every one counted and timed, and the
// abandoned hooks are counted.
func TestSigLongjmpOutOfHooks(t *testing.T) {
	const jumps, k = 200, 1000000
	for _, b := range []struct {
		cc     string
		fentry bool
		mode   timingMode
	}{{"gcc", false, timed}, {"clang", false, timed}, {"gcc", true, timed}, {"clang", true, timed}, {"gcc", false, countOnly}, {"clang", false, countOnly}} {
		t.Run(fmt.Sprintf("%s-fentry%v%s", b.cc, b.fentry, b.mode.suffix), func(t *testing.T) {
			lib := buildRuntime(t, b.cc)
			bin := buildHeal(t, b.cc, "-O2", b.fentry)
			out := filepath.Join(t.TempDir(), "out")
			got := mustRun(t, lib, bin, append([]string{"EDGEPROBE_OUTPUT=" + out}, b.mode.env...), "sigjmp", strconv.Itoa(jumps), strconv.Itoa(k))
			var j, h int
			if _, err := fmt.Sscanf(got, "jumped %d handled %d", &j, &h); err != nil || j != jumps {
				t.Fatalf("fixture output %q", got)
			}
			r := openOutput(t, out)
			funcs := byName(t, r, r.Maps())
			a := funcs["after"]
			if a.Entries != k || a.Exits != k || !b.mode.allTimed(a, k) {
				t.Errorf("after: %d/%d calls, %d timed; want %d/%d, %s", a.Entries, a.Exits, a.Samples, k, k, b.mode.want)
			}
			c := r.Counters()
			if c.AbandonedHooks == 0 || c.AbandonedHooks > jumps {
				t.Errorf("abandoned hooks %d, want 1..%d (one per jump out of a running hook)", c.AbandonedHooks, jumps)
			}
			// The handler's probes run inside the hook it interrupted (dropped
			// as reentrant) or are recorded; either way each is counted once.
			hl := funcs["hleaf"]
			per := uint64(2) // enter and exit hook, or fentry entry and trampoline
			if hl.Entries+c.ReentrantDrops/per < uint64(h)-c.AbandonedHooks || hl.Entries > uint64(h) {
				t.Errorf("hleaf %d entries + %d reentrant drops for %d handler runs", hl.Entries, c.ReentrantDrops, h)
			}
			// One call per abandoned hook may lack its frame or its count;
			// every other function balances exactly.
			var off uint64
			for name, f := range funcs {
				if f.Balanced() {
					continue
				}
				d := int64(f.Entries-f.DeepEntries) - int64(f.Exits-f.Orphans-f.DeepExits+f.Unmatched+f.Open)
				if d < 0 {
					d = -d
				}
				off += uint64(d)
				if name == "after" {
					t.Errorf("after unbalanced: %+v", f)
				}
			}
			if off > c.AbandonedHooks {
				t.Errorf("%d calls unaccounted for, more than the %d abandoned hooks", off, c.AbandonedHooks)
			}
			t.Logf("%d jumps, %d handler runs, %d abandoned hooks, %d reentrant drops, %d unmatched", j, h, c.AbandonedHooks, c.ReentrantDrops, c.Unmatched)
		})
	}
}

// TestToggleStorm: an interpreter-like evaluator (recursive eval, errors
// raised by longjmp from deep in the recursion, sometimes past the shadow
// stack) runs while hotpatch turns its probes on and off hundreds of times,
// whole or one kind only (`--kind entry` then everything, the case that used
// to stop latency recording for good). Afterwards every function's tracked
// entries are accounted for exactly, no frame is left open, and the calls
// made after the storm are all timed.
func TestToggleStorm(t *testing.T) {
	testutil.RequirePtrace(t)
	toggles := 200
	for _, b := range []struct {
		cc   string
		mode timingMode
	}{{"gcc", timed}, {"clang", timed}, {"gcc", countOnly}} {
		cc := b.cc
		t.Run(cc+b.mode.suffix, func(t *testing.T) {
			lib := buildRuntime(t, cc)
			bin := buildHeal(t, cc, "-O2", false)
			if r := testutil.Run(t, "coldpatch", bin); r.Code != 0 {
				t.Fatal(r.Stderr)
			}
			out := filepath.Join(t.TempDir(), "out")
			p := testutil.Start(t, append([]string{"LD_PRELOAD=" + lib, "EDGEPROBE_OUTPUT=" + out}, b.mode.env...), bin, "storm")
			progress := p.Symbol(bin, "progress")
			pid := strconv.Itoa(p.Pid)
			steps := [][]string{
				{"--enable", "*"},
				{"--disable", "*"},
				{"--enable", "eval", "--enable", "op_*", "--kind", "entry"},
				{"--enable", "*"},
				{"--disable", "eval", "--kind", "exit"},
				{"--disable", "raise_err", "--disable", "chain"},
				{"--enable", "*", "--kind", "exit"},
				{"--disable", "*", "--kind", "entry"},
				{"--enable", "chain", "--enable", "run_one", "--kind", "entry"},
				{"--disable", "*"},
			}
			for i := 0; i < toggles; i++ {
				args := append([]string{"--pid", pid}, steps[i%len(steps)]...)
				if r := testutil.Run(t, "hotpatch", args...); r.Code != 0 {
					t.Fatalf("hotpatch %v: exit %d: %s", args, r.Code, r.Stderr)
				}
				p.AwaitProgress(progress, 20)
			}
			if r := testutil.Run(t, "hotpatch", "--pid", pid, "--enable", "*"); r.Code != 0 {
				t.Fatal(r.Stderr)
			}
			p.AwaitProgress(progress, 500)
			if got, _ := p.Finish(); got != "done 0\n" {
				t.Fatalf("fixture output %q", got)
			}
			r := openOutput(t, out)
			funcs := byName(t, r, r.Maps())
			balanced(t, funcs, false)
			a := funcs["after"]
			if a.Entries != 100000 || a.Exits != 100000 || !b.mode.allTimed(a, 100000) {
				t.Errorf("after the storm: %d/%d calls, %d timed; want 100000, %s", a.Entries, a.Exits, a.Samples, b.mode.want)
			}
			if e := funcs["eval"]; (e.Samples == 0) == b.mode.clock {
				t.Errorf("eval: %d timed calls of %d entries, want %s", e.Samples, e.Entries, b.mode.want)
			}
			c := r.Counters()
			t.Logf("%d toggles; eval %d calls, %d timed; counters %+v", toggles, funcs["eval"].Entries, funcs["eval"].Samples, c)
		})
	}
}

// TestExceptionsHeal: C++ exceptions thrown through four probed frames
// (cyg with g++ and clang++, fentry with g++): the frames the exception
// unwinds never exit and are counted unmatched (g++'s cyg frames do exit:
// it calls the exit hook from a cleanup); the catcher's calls and the
// later leaf calls are all timed; every function balances.
func TestExceptionsHeal(t *testing.T) {
	const rounds, k = 1000, 100000
	for _, b := range []struct {
		cxx    string
		fentry bool
	}{{"g++", false}, {"clang++", false}, {"g++", true}} {
		t.Run(fmt.Sprintf("%s-fentry%v", b.cxx, b.fentry), func(t *testing.T) {
			cc := map[string]string{"g++": "gcc", "clang++": "clang"}[b.cxx]
			lib := buildRuntime(t, cc)
			spec := testutil.Spec{Compiler: b.cxx, Opt: "-O2", Sources: []string{"heal_exc.cc"}, Name: fmt.Sprintf("heal_exc-%s-%v", b.cxx, b.fentry)}
			if b.fentry {
				spec.NoInstr, spec.Profile = true, testutil.ProfileFentry
			}
			bin := testutil.Build(t, spec).Path
			out := filepath.Join(t.TempDir(), "out")
			if got := mustRun(t, lib, bin, []string{"EDGEPROBE_OUTPUT=" + out}, strconv.Itoa(rounds), strconv.Itoa(k)); got != fmt.Sprintf("caught %d\n", rounds) {
				t.Fatalf("fixture output %q", got)
			}
			r := openOutput(t, out)
			funcs := byName(t, r, r.Maps())
			th, c, l := funcs["thrower"], funcs["catcher"], funcs["leaf"]
			// g++ -finstrument-functions calls the exit hook from a cleanup
			// during unwinding; clang++ and fentry frames just vanish.
			wantExits := uint64(0)
			if b.cxx == "g++" && !b.fentry {
				wantExits = 4 * rounds
			}
			if th.Entries != 4*rounds || th.Exits != wantExits || th.Exits+th.Unmatched != 4*rounds {
				t.Errorf("thrower %d/%d calls, %d unmatched; want %d entries, %d exits, the rest unmatched", th.Entries, th.Exits, th.Unmatched, 4*rounds, wantExits)
			}
			if c.Entries != rounds || c.Exits != rounds || c.Samples != rounds {
				t.Errorf("catcher %d/%d calls, %d timed; want %d, all timed", c.Entries, c.Exits, c.Samples, rounds)
			}
			if l.Entries != k || l.Exits != k || l.Samples != k {
				t.Errorf("leaf %d/%d calls, %d timed; want %d, all timed", l.Entries, l.Exits, l.Samples, k)
			}
			balanced(t, funcs, false)
		})
	}
}

// TestKindEntryThenAll: the example of our own help, `--enable SEL --kind
// entry`, then `--disable '*'` and everything on: entry-only probes push
// frames no exit pops, which used to fill the shadow stack for good (every
// later call counted, none timed). Each enter now finds its previous sibling
// dead.
func TestKindEntryThenAll(t *testing.T) {
	testutil.RequirePtrace(t)
	for _, mode := range []timingMode{timed, countOnly} {
		t.Run("gcc"+mode.suffix, func(t *testing.T) {
			lib := buildRuntime(t, "gcc")
			bin := buildHeal(t, "gcc", "-O2", false)
			if r := testutil.Run(t, "coldpatch", bin); r.Code != 0 {
				t.Fatal(r.Stderr)
			}
			out := filepath.Join(t.TempDir(), "out")
			p := testutil.Start(t, append([]string{"LD_PRELOAD=" + lib, "EDGEPROBE_OUTPUT=" + out}, mode.env...), bin, "storm")
			progress := p.Symbol(bin, "progress")
			pid := strconv.Itoa(p.Pid)
			for _, args := range [][]string{{"--enable", "*", "--kind", "entry"}, {"--disable", "*"}, {"--enable", "*"}} {
				if r := testutil.Run(t, "hotpatch", append([]string{"--pid", pid}, args...)...); r.Code != 0 {
					t.Fatalf("hotpatch %v: %s", args, r.Stderr)
				}
				p.AwaitProgress(progress, 2000)
			}
			if got, _ := p.Finish(); got != "done 0\n" {
				t.Fatalf("fixture output %q", got)
			}
			r := openOutput(t, out)
			funcs := byName(t, r, r.Maps())
			balanced(t, funcs, false)
			for _, name := range []string{"eval", "lit", "after"} {
				f := funcs[name]
				matched := f.Exits - f.Orphans - f.DeepExits
				if mode.clock && (f.Samples == 0 || f.Samples+f.DeepExits < f.Exits-f.Orphans) || !mode.clock && (matched == 0 || f.Samples != 0) {
					t.Errorf("%s: %d matched exits, %d timed; want %s", name, matched, f.Samples, mode.want)
				}
			}
			if a := funcs["after"]; a.Entries != 100000 || a.Exits != 100000 || !mode.allTimed(a, 100000) {
				t.Errorf("after: %d/%d calls, %d timed; want 100000, %s", a.Entries, a.Exits, a.Samples, mode.want)
			}
			if c := r.Counters(); c.StackOverflows > c.DeepLost+uint64(funcs["chain"].DeepExits) {
				t.Errorf("deep entries %d beyond what chain() explains: %+v", c.StackOverflows, c)
			}
		})
	}
}
