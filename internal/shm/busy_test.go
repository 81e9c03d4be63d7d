package shm

import (
	"fmt"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestBusyWordSameFrame: a SIGSEGV handler siglongjmps out of a running
// enter hook (the fixture makes the region read-only, so the hook faults at
// its first store, deterministically, with its busy word set), and the next
// hook on the thread runs at exactly the abandoned hook's frame with the same
// return address in it (same call site, same stack depth). The return
// address alone would call that word live and drop the hook, and every hook
// after it at that frame; the position rule (D15: at or above the busy
// frame, on the same stack, the word is stale) must clear it. Every one of
// the J jumps is counted as an abandoned hook, no hook is dropped as
// reentrant, and victim's every completed call is counted and timed.
func TestBusyWordSameFrame(t *testing.T) {
	const jumps, k = 200, 10000
	for _, b := range []struct {
		cc, opt string
		fentry  bool
	}{{"gcc", "-O0", false}, {"gcc", "-O2", false}, {"clang", "-O2", false}, {"gcc", "-O2", true}, {"clang", "-O2", true}} {
		t.Run(fmt.Sprintf("%s%s-fentry%v", b.cc, b.opt, b.fentry), func(t *testing.T) {
			lib := buildRuntime(t, b.cc)
			spec := testutil.Spec{Compiler: b.cc, Opt: b.opt, Sources: []string{"busyframe.c"},
				Name: fmt.Sprintf("busyframe-%s%s-fentry%v", b.cc, b.opt, b.fentry)}
			if b.fentry {
				spec.NoInstr = true
				spec.Profile = testutil.ProfileFentry
			}
			bin := testutil.Build(t, spec).Path
			out := filepath.Join(t.TempDir(), "out")
			got := mustRun(t, lib, bin, []string{"EDGEPROBE_OUTPUT=" + out}, strconv.Itoa(jumps), strconv.Itoa(k))
			if got != fmt.Sprintf("faults %d\n", jumps) {
				t.Fatalf("fixture output %q", got)
			}
			r := openOutput(t, out)
			c := r.Counters()
			if c.AbandonedHooks != jumps || c.ReentrantDrops != 0 {
				t.Errorf("abandoned hooks %d, reentrant drops %d: want %d, 0", c.AbandonedHooks, c.ReentrantDrops, jumps)
			}
			if c.Orphans+c.Unmatched+c.FuncDropEnters+c.PreinitDrops != 0 {
				t.Errorf("losses: %+v", c)
			}
			// One call before the loop, one rebuilt call per jump, then k.
			want := uint64(1 + jumps + k)
			v := byName(t, r, r.Maps())["victim"]
			if v.Entries != want || v.Exits != want || v.Samples != want || !v.Balanced() {
				t.Errorf("victim: %d/%d calls, %d timed, balanced %v; want %d/%d, all timed", v.Entries, v.Exits, v.Samples, v.Balanced(), want, want)
			}
		})
	}
}
