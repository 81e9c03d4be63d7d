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
// Now such a return takes the dropped entry's address (the graveyard), the
// program's output is the same as without the runtime, and every call of
// handle() is counted, each one matched or counted unmatched (balanced).
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
				if h.Entries != started || !h.Balanced() || h.Exits+h.Unmatched+h.Open != started {
					t.Errorf("handle: %d entries, %d exits, %d unmatched, %d open, balanced %v; want %d entries, each exited, unmatched or open",
						h.Entries, h.Exits, h.Unmatched, h.Open, h.Balanced(), started)
				}
			})
		}
	}
}
