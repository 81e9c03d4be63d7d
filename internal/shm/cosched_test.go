package shm

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestFentryCoroutines (review7): a scheduler of eight ucontext coroutines
// on one thread (cosched.c), each yielding inside probed functions through
// a probed wrapper that tail-calls swapcontext at -O2, so the saved context
// holds the hijacked return address. Under the fentry provider the program
// died of SIGILL within ten switches ("fentry return through an unknown
// frame"): another coroutine's hooks judged the suspended one's frames dead
// (its stack lies below), dropped their entries and gave their slots their
// return addresses back, but the context resumed at the trampoline's copy.
// Then such a return took the dropped entry's address (the graveyard); now
// (D102) the coroutine's entries never leave it: the runtime's swapcontext
// parks them, with its shadow frames, on the coroutine's stack. The
// program's output is the same as without the runtime and every call of
// handle() that returned is counted exited, matched.
func TestFentryCoroutines(t *testing.T) {
	const rounds = "3000"
	for _, cc := range []string{"gcc", "clang"} {
		for _, opt := range []string{"-O0", "-O2"} {
			t.Run(cc+opt, func(t *testing.T) {
				lib := buildRuntime(t, cc)
				bin := testutil.Build(t, testutil.Spec{Compiler: cc, Opt: opt, Sources: []string{"cosched.c"}, NoInstr: true,
					Profile: testutil.ProfileFentry, Name: fmt.Sprintf("cosched-%s%s", cc, opt)}).Path
				want := mustRun(t, "", bin, nil, rounds)
				var started, finished uint64
				if _, err := fmt.Sscanf(want, "started %d finished %d", &started, &finished); err != nil || started == 0 {
					t.Fatalf("fixture without the runtime said %q", want)
				}
				out := filepath.Join(t.TempDir(), "out")
				if got := mustRun(t, lib, bin, []string{"EDGEPROBE_OUTPUT=" + out}, rounds); got != want {
					t.Fatalf("with the runtime: %q, without: %q", got, want)
				}
				r := openOutput(t, out)
				h := byName(t, r, r.Maps())["handle"]
				// D102: the runtime's swapcontext parks a suspended
				// coroutine's frames and entries with it, so each call
				// that returned exited matched; the calls of coroutines
				// still suspended at the end are counted unmatched.
				if h.Entries != started || !h.Balanced() || h.Exits != finished || h.Orphans != 0 || h.Unmatched+h.Open != started-finished {
					t.Errorf("handle: %d entries, %d exits, %d orphans, %d unmatched, %d open, balanced %v; want %d entries, %d exits matched, the rest unmatched",
						h.Entries, h.Exits, h.Orphans, h.Unmatched, h.Open, h.Balanced(), started, finished)
				}
			})
		}
	}
}
