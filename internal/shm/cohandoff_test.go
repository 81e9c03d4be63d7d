package shm

import (
	"fmt"
	"path/filepath"
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
					spec := testutil.Spec{Compiler: cc, Opt: opt, Sources: []string{"cohandoff.c"}, Flags: []string{"-pthread"},
						Name: fmt.Sprintf("cohandoff-%s%s-%s", cc, opt, prof)}
					if prof == testutil.ProfileFentry {
						spec.NoInstr, spec.Profile = true, prof
					}
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
					got := mustRun(t, lib, bin, []string{"EDGEPROBE_OUTPUT=" + out}, fmt.Sprint(rounds))
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
