package hotpatch

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestSessionCoroutines (D102): a session toggles the probes of handle(),
// yield_now() and dispatch() 1000 times while eight coroutines migrate
// between three worker threads at every yield (cohandoff.c in stop-file
// mode, runtime preloaded), gcc and clang, cyg and fentry: every toggle
// succeeds, the program runs to its end with every call finished and every
// resume a migration (no signal death: before D102 the fentry build died
// of SIGILL at its first migrated return), work(), never toggled and
// called inside handle(), has exactly two calls per handle() call, each
// exited matched, and every function balances (calls cut by a toggle are
// counted unmatched or orphaned, never lost).
func TestSessionCoroutines(t *testing.T) {
	testutil.RequirePtrace(t)
	for _, cc := range []string{"gcc", "clang"} {
		for _, prof := range []string{"cyg", testutil.ProfileFentry} {
			t.Run(cc+"-"+prof, func(t *testing.T) {
				spec := testutil.Spec{Compiler: cc, Opt: "-O2", Sources: []string{"cohandoff.c"}, Flags: []string{"-pthread"},
					Name: fmt.Sprintf("cohandoff-%s-%s", cc, prof)}
				if prof == testutil.ProfileFentry {
					spec.NoInstr, spec.Profile = true, prof
				}
				bin := testutil.Build(t, spec).Path
				out := filepath.Join(t.TempDir(), "out")
				p := testutil.Start(t, []string{"LD_PRELOAD=" + testutil.Runtime(t, cc), "EDGEPROBE_OUTPUT=" + out}, bin)
				names := map[uint64]string{}
				for _, name := range []string{"handle", "yield_now", "dispatch", "work"} {
					names[p.Symbol(bin, name)] = name
				}
				ss := startSession(t, &subject{Process: p})
				const n = 1000
				sites := 6 // three functions' enter and exit hook calls
				if prof == testutil.ProfileFentry {
					sites = 3 // one __fentry__ call each
				}
				var script strings.Builder
				for i := 0; i < n/2; i++ {
					script.WriteString("disable handle yield_now dispatch\nenable handle yield_now dispatch\n")
				}
				script.WriteString("stats\n")
				go func() {
					ss.in.Write([]byte(script.String()))
					ss.in.Close()
				}()
				for i := 1; i <= n; i++ {
					if l := ss.read(t); !l.OK || l.Line != i || l.Changed != sites {
						t.Fatalf("toggle %d: %+v (stderr %q)", i, l, ss.stderr.String())
					}
				}
				if l := ss.read(t); l.Toggles == nil || *l.Toggles != sites*n || *l.Errors != 0 {
					t.Fatalf("stats: %+v", l)
				}
				ss.wait(t)
				rest, stderr := p.Finish()
				var s, f, m uint64
				if _, err := fmt.Sscanf(rest, "started %d finished %d migrations %d", &s, &f, &m); err != nil || s == 0 || f != s || m != s {
					t.Fatalf("program said %q (stderr %q): want every call finished and every resume a migration", rest, stderr)
				}
				t.Logf("%d calls, %d migrations under %d toggles", s, m, sites*n)
				r, err := shm.Open(out)
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				fs := map[string]shm.Func{}
				for _, fn := range r.Functions() {
					if name, ok := names[fn.Addr]; ok {
						fs[name] = fn
					}
				}
				if w := fs["work"]; w.Entries != 2*s || w.Exits != 2*s || w.Orphans+w.Unmatched+w.Open != 0 {
					t.Errorf("work: %d entries, %d exits, %d orphans, %d unmatched, %d open; want %d calls, each matched",
						w.Entries, w.Exits, w.Orphans, w.Unmatched, w.Open, 2*s)
				}
				for _, name := range []string{"handle", "yield_now", "dispatch"} {
					if g := fs[name]; g.Entries == 0 || !g.Balanced() {
						t.Errorf("%s: %d entries, %d exits, %d orphans, %d unmatched, %d open: want some calls, balanced",
							name, g.Entries, g.Exits, g.Orphans, g.Unmatched, g.Open)
					}
				}
			})
		}
	}
}
