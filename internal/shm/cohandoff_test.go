package shm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestCoroutineHandoff (D102): eight ucontext coroutines on three worker
// threads, every resume on another thread than the coroutine's last
// (cohandoff.c), so each coroutine migrates at every yield: thousands of
// migrations per run. Each yield happens inside probed handle() and inside
// yield_now(), which tail-calls swapcontext at -O2. Before D102 the fentry
// provider killed the program with SIGILL at the first return on the new
// thread (the hijacked slot's entry was on the old one), and the cyg
// provider matched one coroutine's exit to another's frame (latencies
// swapped, frames popped unmatched). Now the runtime's swapcontext carries
// the suspended context's shadow frames and return-stack entries on its
// own stack to whichever thread resumes it: the program's output is the
// same as without the runtime, every call of every probed function exits
// matched (entries == exits, nothing orphaned, unmatched or open, no drop
// anywhere), and handle()'s recorded latencies enclose the program's own
// measurement of each call (an exit matched to another call's enter could
// report less than the program saw).
//
// The static variants link libedgeprobe.a, whose swapcontext calls libc.a's
// by its internal name (EP_ARCHIVE: no dlsym in a static program).
func TestCoroutineHandoff(t *testing.T) {
	const rounds = 1000
	for _, cc := range []string{"gcc", "clang"} {
		archive := testutil.RuntimeArchive(t, cc) // once per compiler: each build compiles the runtime
		for _, opt := range []string{"-O0", "-O2", "-O2-static"} {
			for _, prof := range []string{"cyg", testutil.ProfileFentry} {
				t.Run(cc+opt+"-"+prof, func(t *testing.T) {
					spec := cohandoffSpec(cc, opt, prof)
					var lib string
					if opt == "-O2-static" {
						spec.Opt, spec.Static, spec.PIE = "-O2", true, testutil.Bool(false)
						spec.LDFlags = []string{"-Wl,--whole-archive", archive, "-Wl,--no-whole-archive"}
						plainSpec := spec
						plainSpec.LDFlags, plainSpec.Name = nil, spec.Name+"-plain"
						if prof == "cyg" {
							plainSpec.NoInstr = true // glibc's static hooks are no-ops anyway
						}
						checkHandoffPlain(t, testutil.Build(t, plainSpec).Path, rounds)
					} else {
						lib = buildRuntime(t, cc)
					}
					bin := testutil.Build(t, spec).Path
					if lib != "" {
						checkHandoffPlain(t, bin, rounds)
					}
					var s, f, m, lo, hi uint64
					out := filepath.Join(t.TempDir(), "out")
					// the program's clock: the enclosure is then exact (a TSC
					// calibrated over 0.5 ms is off by some ppm: tens of ns on
					// a call descheduled for milliseconds)
					got := mustRun(t, lib, bin, []string{"EDGEPROBE_OUTPUT=" + out, "EDGEPROBE_CLOCK=mono"}, fmt.Sprint(rounds))
					if _, err := fmt.Sscanf(got, "started %d finished %d migrations %d min %d max %d", &s, &f, &m, &lo, &hi); err != nil ||
						s != 8*rounds || f != s || m != s {
						t.Fatalf("with the runtime: %q; want %d started, finished and migrations", got, 8*rounds)
					}
					r := openOutput(t, out)
					fs := byName(t, r, r.Maps())
					calls := map[string]uint64{"handle": s, "yield_now": s, "work": 2 * s, "dispatch": s + 8}
					for name, n := range calls {
						g := fs[name]
						if g.Entries != n || g.Exits != n || g.Orphans != 0 || g.Unmatched != 0 || g.Open != 0 || !g.Balanced() {
							t.Errorf("%s: %d entries, %d exits, %d orphans, %d unmatched, %d open; want %d calls, each exited matched",
								name, g.Entries, g.Exits, g.Orphans, g.Unmatched, g.Open, n)
						}
					}
					if h := fs["handle"]; h.Samples != s || h.MinNs < lo || h.MaxNs < hi {
						t.Errorf("handle: %d samples, min %d ns, max %d ns; the program measured min %d, max %d inside %d calls: "+
							"every recorded latency must enclose its call's", h.Samples, h.MinNs, h.MaxNs, lo, hi, s)
					}
					noMismatch(t, r.Counters())
					if c := r.Counters(); c.FentryRestored != 0 {
						t.Errorf("%d hijacked slots given back: every frame should have returned through its entry", c.FentryRestored)
					}
				})
			}
		}
	}
}

// checkHandoffPlain runs cohandoff without the runtime: every call started,
// finished, and resumed on another thread.
func checkHandoffPlain(t *testing.T, bin string, rounds uint64) {
	t.Helper()
	plain := mustRun(t, "", bin, nil, fmt.Sprint(rounds))
	var s, f, m uint64
	if _, err := fmt.Sscanf(plain, "started %d finished %d migrations %d", &s, &f, &m); err != nil ||
		s != 8*rounds || f != s || m != s {
		t.Fatalf("without the runtime: %q; want %d started, finished and migrations", plain, 8*rounds)
	}
}

// TestCoroutineHandoffDeep: cohandoff.c with every yield from D frames of
// the probed recursive nest(), the coroutines on 16 KiB stacks with a guard
// page (the record is allocated there: it must never overflow one). At
// D = 20 the suspended context's record fits (EP_PARK_MAX, 2 KiB, D102) and
// every call exits matched, as in TestCoroutineHandoff. At D = 100 it does
// not: the runtime parks nothing
// and gives the calls in progress up at each switch, never a wrong return
// nor a trap: fentry gives each hijacked slot its return address back in
// place (the slots are on the stack being switched out, suspended under
// this very call) and those calls return unmeasured; cyg exits become
// orphans. Either way each given-up call is counted unmatched, exactly,
// and the dispatcher's own calls (parked with the workers) stay matched.
func TestCoroutineHandoffDeep(t *testing.T) {
	const rounds = 200
	for _, cc := range []string{"gcc", "clang"} {
		for _, prof := range []string{"cyg", testutil.ProfileFentry} {
			t.Run(cc+"-"+prof, func(t *testing.T) {
				lib := buildRuntime(t, cc)
				bin := testutil.Build(t, cohandoffSpec(cc, "-O2", prof)).Path
				for _, depth := range []uint64{20, 100} {
					out := filepath.Join(t.TempDir(), "out")
					got := mustRun(t, lib, bin, []string{"EDGEPROBE_OUTPUT=" + out}, fmt.Sprint(rounds), fmt.Sprint(depth), "nosig", "small")
					var s, f, m uint64
					if _, err := fmt.Sscanf(got, "started %d finished %d migrations %d", &s, &f, &m); err != nil ||
						s != 8*rounds || f != s || m != s {
						t.Fatalf("depth %d: %q; want %d started, finished and migrations", depth, got, 8*rounds)
					}
					r := openOutput(t, out)
					fs := byName(t, r, r.Maps())
					for name, n := range map[string]uint64{"work": 2 * s, "dispatch": s + 8} {
						if g := fs[name]; g.Entries != n || g.Exits != n || g.Orphans+g.Unmatched+g.Open != 0 {
							t.Errorf("depth %d: %s: %d entries, %d exits, %d orphans, %d unmatched, %d open; want %d, matched",
								depth, name, g.Entries, g.Exits, g.Orphans, g.Unmatched, g.Open, n)
						}
					}
					c := r.Counters()
					for name, n := range map[string]uint64{"handle": s, "nest": s * depth, "yield_now": s} {
						g := fs[name]
						want := Func{Entries: n, Exits: n}
						switch {
						case depth == 20:
						case prof == "cyg":
							want.Orphans, want.Unmatched = n, n
						default:
							want.Exits, want.Unmatched = 0, n
						}
						if g.Entries != want.Entries || g.Exits != want.Exits || g.Orphans != want.Orphans || g.Unmatched != want.Unmatched ||
							g.Open != 0 || !g.Balanced() {
							t.Errorf("depth %d: %s: %d entries, %d exits, %d orphans, %d unmatched, %d open; want %d, %d, %d, %d, 0",
								depth, name, g.Entries, g.Exits, g.Orphans, g.Unmatched, g.Open, want.Entries, want.Exits, want.Orphans, want.Unmatched)
						}
					}
					restored := uint64(0)
					if depth == 100 && prof == testutil.ProfileFentry {
						restored = s * (depth + 2)
					}
					if c.FentryRestored != restored {
						t.Errorf("depth %d: %d hijacked slots given back, want %d", depth, c.FentryRestored, restored)
					}
				}
			})
		}
	}
}

// TestCoroutineLatencies (review7's F5, D102): two ucontext coroutines on
// one thread inside the same probed function (coswap.c): A enters, B
// enters, A returns, B returns. Before D102 the cyg provider matched each
// exit to the other call's frame (recorded 1 ms and 7 ms where the calls
// took 6 and 2, nothing counted lost), and the fentry provider lost B's
// exit. Now each coroutine's frames are parked with it: every call exits
// matched, and every recorded latency lies between the program's own
// measurement inside the call and around it (a swapped start time falls
// outside: the earlier enter makes one call too long, the later one the
// other too short).
func TestCoroutineLatencies(t *testing.T) {
	const rounds = 3
	for _, cc := range []string{"gcc", "clang"} {
		for _, opt := range []string{"-O0", "-O2"} {
			for _, prof := range []string{"cyg", testutil.ProfileFentry} {
				t.Run(cc+opt+"-"+prof, func(t *testing.T) {
					lib := buildRuntime(t, cc)
					spec := testutil.Spec{Compiler: cc, Opt: opt, Sources: []string{"coswap.c"},
						Name: fmt.Sprintf("coswap-%s%s-%s", cc, opt, prof)}
					if prof == testutil.ProfileFentry {
						spec.NoInstr, spec.Profile = true, prof
					}
					bin := testutil.Build(t, spec).Path
					out := filepath.Join(t.TempDir(), "out")
					// the program's clock (CLOCK_MONOTONIC): the bounds are then exact
					got := mustRun(t, lib, bin, []string{"EDGEPROBE_OUTPUT=" + out, "EDGEPROBE_CLOCK=mono"}, fmt.Sprint(rounds))
					var calls, inner, outer uint64
					if _, err := fmt.Sscanf(got, "calls %d inner_min %d outer_max %d", &calls, &inner, &outer); err != nil || calls != 2*rounds {
						t.Fatalf("with the runtime: %q; want %d calls", got, 2*rounds)
					}
					r := openOutput(t, out)
					h := byName(t, r, r.Maps())["handle"]
					if h.Entries != calls || h.Exits != calls || h.Samples != calls || h.Orphans+h.Unmatched+h.Open != 0 {
						t.Errorf("handle: %d entries, %d exits, %d samples, %d orphans, %d unmatched, %d open; want %d calls, each timed and matched",
							h.Entries, h.Exits, h.Samples, h.Orphans, h.Unmatched, h.Open, calls)
					}
					if h.MinNs < inner || h.MaxNs > outer {
						t.Errorf("handle: recorded min %d ns, max %d ns; the program measured no call shorter than %d ns inside it "+
							"and none longer than %d ns around it", h.MinNs, h.MaxNs, inner, outer)
					}
					noMismatch(t, r.Counters())
				})
			}
		}
	}
}

// TestFentryHealAcrossThreads (D104; review7's question on F6): a thread's
// healing must never write into a slot another thread has hijacked since
// (cohazard.c). A coroutine's f() is hijacked on thread A and yields; thread
// B resumes it, f longjmps out (no hook sees its frame die) and g() is
// called from the same frame, so its return slot is the same address,
// hijacked on B; g yields; A then calls h() on its own stack, and A's
// healing judged f's entry dead. Before D102 it gave the slot f's return
// address back: the slot still held the trampoline (g's hijack), and g
// returned into f's call site ("where 1", fentry_restored 1; at -O2 worse:
// "where 0", or SIGSEGV with clang). Now f's entry travels with the
// coroutine and dies on B, where g's hijack replaces it: g returns home and
// exits matched, f is counted unmatched, and no slot is given back.
func TestFentryHealAcrossThreads(t *testing.T) {
	for _, cc := range []string{"gcc", "clang"} {
		for _, opt := range []string{"-O0", "-O2"} {
			t.Run(cc+opt, func(t *testing.T) {
				lib := buildRuntime(t, cc)
				bin := testutil.Build(t, testutil.Spec{Compiler: cc, Opt: opt, Sources: []string{"cohazard.c"}, NoInstr: true,
					Flags: []string{"-pthread"}, Profile: testutil.ProfileFentry, Name: "cohazard-" + cc + opt}).Path
				if got := mustRun(t, "", bin, nil); got != "where 2 h 1\n" {
					t.Fatalf("without the runtime: %q, want where 2 h 1", got)
				}
				out := filepath.Join(t.TempDir(), "out")
				if got := mustRun(t, lib, bin, []string{"EDGEPROBE_OUTPUT=" + out}); got != "where 2 h 1\n" {
					t.Fatalf("with the runtime: %q, want where 2 h 1 (g returned to its own call site)", got)
				}
				r := openOutput(t, out)
				fs := byName(t, r, r.Maps())
				checkCounts(t, fs, map[string]ee{"f": {1, 0}, "g": {1, 1}, "h": {1, 1}})
				if f, g := fs["f"], fs["g"]; f.Unmatched != 1 || g.Unmatched+g.Orphans != 0 || !f.Balanced() || !g.Balanced() {
					t.Errorf("f: %d unmatched; g: %d unmatched, %d orphans; want f's dead frame unmatched, g matched", f.Unmatched, g.Unmatched, g.Orphans)
				}
				if c := r.Counters(); c.FentryRestored != 0 {
					t.Errorf("%d slots given back; want none (no thread holds another's entries)", c.FentryRestored)
				}
			})
		}
	}
}

// TestCoroutineFork (D102): fork while a coroutine is suspended inside
// probed handle() (cofork.c); parent and child each resume their copy and
// handle() returns in both. The parked record is the parent's: in the
// parent the call exits matched; in the child, whose region never counted
// the entry, the exit is an orphan (balanced) and nothing of the parent's
// region is touched; both processes run to their end.
func TestCoroutineFork(t *testing.T) {
	for _, cc := range []string{"gcc", "clang"} {
		for _, opt := range []string{"-O0", "-O2"} {
			for _, prof := range []string{"cyg", testutil.ProfileFentry} {
				t.Run(cc+opt+"-"+prof, func(t *testing.T) {
					lib := buildRuntime(t, cc)
					spec := testutil.Spec{Compiler: cc, Opt: opt, Sources: []string{"cofork.c"},
						Name: fmt.Sprintf("cofork-%s%s-%s", cc, opt, prof)}
					if prof == testutil.ProfileFentry {
						spec.NoInstr, spec.Profile = true, prof
					}
					bin := testutil.Build(t, spec).Path
					if got := mustRun(t, "", bin, nil); !strings.HasSuffix(got, " status 0 done 7\n") {
						t.Fatalf("without the runtime: %q", got)
					}
					parent, child := runForked(t, lib, bin, "run")
					p := byName(t, parent, parent.Maps())["handle"]
					if p.Entries != 1 || p.Exits != 1 || p.Samples != 1 || p.Orphans+p.Unmatched+p.Open != 0 {
						t.Errorf("parent's handle: %d entries, %d exits, %d samples, %d orphans, %d unmatched, %d open; want one matched call",
							p.Entries, p.Exits, p.Samples, p.Orphans, p.Unmatched, p.Open)
					}
					c := byName(t, child, child.Maps())["handle"]
					if c.Entries != 0 || c.Exits != 1 || c.Orphans != 1 || c.Unmatched+c.Open != 0 || !c.Balanced() {
						t.Errorf("child's handle: %d entries, %d exits, %d orphans, %d unmatched, %d open; want one orphan exit",
							c.Entries, c.Exits, c.Orphans, c.Unmatched, c.Open)
					}
				})
			}
		}
	}
}

// TestCoroutineHandoffSignals (D102): cohandoff.c with a thread sending
// SIGUSR1 to the workers without pause; the handler calls probed onsig() on
// whatever stack the worker runs: a coroutine's, the middle of a park or a
// resume, a hook. The switches and the handler's hooks exclude each other
// through the thread's busy word: every call of the coroutines' functions
// still exits matched, each handler call is counted matched or, when it
// interrupted a hook (or a park), dropped and counted (reentrant; late when
// the signal landed in a worker's thread-exit handlers), and the program
// runs to its end.
func TestCoroutineHandoffSignals(t *testing.T) {
	const rounds = 5000
	for _, cc := range []string{"gcc", "clang"} {
		for _, prof := range []string{"cyg", testutil.ProfileFentry} {
			t.Run(cc+"-"+prof, func(t *testing.T) {
				lib := buildRuntime(t, cc)
				bin := testutil.Build(t, cohandoffSpec(cc, "-O2", prof)).Path
				out := filepath.Join(t.TempDir(), "out")
				got := mustRun(t, lib, bin, []string{"EDGEPROBE_OUTPUT=" + out}, fmt.Sprint(rounds), "0", "sig")
				var s, f, m, lo, hi, handled uint64
				if _, err := fmt.Sscanf(got, "started %d finished %d migrations %d min %d max %d handled %d", &s, &f, &m, &lo, &hi, &handled); err != nil ||
					s != 8*rounds || f != s || m != s || handled == 0 {
					t.Fatalf("with the runtime: %q; want %d started, finished and migrations, and signals handled", got, 8*rounds)
				}
				r := openOutput(t, out)
				fs := byName(t, r, r.Maps())
				for name, n := range map[string]uint64{"handle": s, "yield_now": s, "work": 2 * s, "dispatch": s + 8} {
					if g := fs[name]; g.Entries != n || g.Exits != n || g.Orphans+g.Unmatched+g.Open != 0 {
						t.Errorf("%s: %d entries, %d exits, %d orphans, %d unmatched, %d open; want %d calls, each matched",
							name, g.Entries, g.Exits, g.Orphans, g.Unmatched, g.Open, n)
					}
				}
				o, c := fs["onsig"], r.Counters()
				// a handler call lost to a hook it interrupted: reentrant; to
				// a slot claim it interrupted (a worker's first hook): early;
				// run after its thread's exit handlers (a signal in flight
				// as the worker ends): late
				drops := c.ReentrantDrops + c.PreinitDrops + c.LateDrops
				if o.Entries != o.Exits || o.Orphans+o.Unmatched+o.Open != 0 || o.Entries > handled || handled-o.Entries > drops {
					t.Errorf("onsig: %d entries, %d exits, %d orphans, %d unmatched, %d open; %d reentrant, %d early drops; %d handler runs: "+
						"each matched or a counted drop (counters %+v)", o.Entries, o.Exits, o.Orphans, o.Unmatched, o.Open, c.ReentrantDrops, c.PreinitDrops, handled, c)
				}
				t.Logf("%d migrations, %d signals handled, %d reentrant, %d early, %d late drops", m, handled, c.ReentrantDrops, c.PreinitDrops, c.LateDrops)
			})
		}
	}
}

// TestCoroutineParkedLive (D102, D103): five coroutines suspended inside
// probed handle() while the process idles (copark.c). Read live, the five
// calls are on no thread's shadow stack (every slot's depth 0: they are
// parked with their coroutines), yet counted open through the cache
// entries' parked counts, so handle() balances; once a second thread has
// resumed them (handle returns there), the same reading shows five matched,
// timed exits and nothing open.
func TestCoroutineParkedLive(t *testing.T) {
	testutil.RequirePtrace(t) // reads the live region
	for _, cc := range []string{"gcc", "clang"} {
		for _, prof := range []string{"cyg", testutil.ProfileFentry} {
			t.Run(cc+"-"+prof, func(t *testing.T) {
				lib := buildRuntime(t, cc)
				spec := testutil.Spec{Compiler: cc, Opt: "-O2", Sources: []string{"copark.c"}, Flags: []string{"-pthread"},
					Name: fmt.Sprintf("copark-%s-%s", cc, prof)}
				if prof == testutil.ProfileFentry {
					spec.NoInstr, spec.Profile = true, prof
				}
				bin := testutil.Build(t, spec).Path
				gofile := filepath.Join(t.TempDir(), "go")
				p := testutil.Start(t, []string{"LD_PRELOAD=" + lib}, bin, gofile)
				handle := p.Symbol(bin, "handle")
				read := func() (Func, []Thread) {
					r, err := OpenPID(p.Pid)
					if err != nil {
						t.Fatal(err)
					}
					defer r.Close()
					for _, f := range r.Functions() {
						if f.Addr == handle {
							return f, r.Threads()
						}
					}
					t.Fatal("handle not recorded")
					return Func{}, nil
				}
				h, ths := read()
				if h.Entries != 5 || h.Exits != 0 || h.Open != 5 || h.Unmatched+h.Orphans != 0 || !h.Balanced() {
					t.Errorf("suspended: handle %d entries, %d exits, %d open, %d unmatched, %d orphans, balanced %v; want 5 calls open",
						h.Entries, h.Exits, h.Open, h.Unmatched, h.Orphans, h.Balanced())
				}
				for _, th := range ths {
					if th.Depth != 0 {
						t.Errorf("suspended: thread slot %d (tid %d) has shadow depth %d; want every call parked with its coroutine", th.Index, th.Tid, th.Depth)
					}
				}
				if err := os.WriteFile(gofile, nil, 0o644); err != nil {
					t.Fatal(err)
				}
				if l := p.Line(); l != "resumed 5" {
					t.Fatalf("after go: %q, want resumed 5", l)
				}
				h, _ = read()
				if h.Entries != 5 || h.Exits != 5 || h.Samples != 5 || h.Open+h.Unmatched+h.Orphans != 0 || !h.Balanced() {
					t.Errorf("resumed: handle %d entries, %d exits, %d samples, %d open, %d unmatched, %d orphans; want 5 matched, timed exits",
						h.Entries, h.Exits, h.Samples, h.Open, h.Unmatched, h.Orphans)
				}
				if out, _ := p.Finish(); out != "done 5\n" {
					t.Errorf("program ended with %q, want done 5", out)
				}
			})
		}
	}
}

// cohandoffSpec is cohandoff.c built with cc at opt for the provider prof
// ("cyg", or testutil.ProfileFentry: -pg -mfentry instead of
// -finstrument-functions); each combination has a binary of its own.
func cohandoffSpec(cc, opt, prof string) testutil.Spec {
	spec := testutil.Spec{Compiler: cc, Opt: opt, Sources: []string{"cohandoff.c"}, Flags: []string{"-pthread"},
		Name: fmt.Sprintf("cohandoff-%s%s-%s", cc, opt, prof)}
	if prof == testutil.ProfileFentry {
		spec.NoInstr, spec.Profile = true, prof
	}
	return spec
}
