package shm

import (
	"path/filepath"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestNewGeneration: with a new generation started between a missed exit and
// an unseen entry, the exit is an orphan and the stale frame unmatched, and
// only the clean call is timed; without it, the exit would match the stale
// frame and record a latency spanning both calls. Counting only (D85's own
// fast path) the same: the exit must still be an orphan, not a match.
func TestNewGeneration(t *testing.T) {
	testutil.RequirePtrace(t) // reads the live region and the process's memory map
	lib := buildRuntime(t, "gcc")
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"stale.c"}, NoInstr: true, Opt: "-O1"})
	for _, c := range []struct {
		bump bool
		mode timingMode
	}{{true, timed}, {false, timed}, {true, countOnly}, {false, countOnly}} {
		bump := c.bump
		out := filepath.Join(t.TempDir(), "out.ep")
		p := testutil.Start(t, append([]string{"LD_PRELOAD=" + lib, "EDGEPROBE_OUTPUT=" + out}, c.mode.env...), fx.Path)
		f := p.Symbol(fx.Path, "f")
		if bump {
			r, err := OpenPID(p.Pid)
			if err != nil {
				t.Fatal(err)
			}
			if n, err := r.NewGeneration([]uint64{f, f + 1}); err != nil || n != 1 {
				t.Fatalf("NewGeneration = %d, %v; want 1 (f recorded, f+1 not)", n, err)
			}
			r.Close()
		}
		p.Finish()
		r := openOutput(t, out)
		var got *Func
		for _, fn := range r.Functions() {
			if fn.Addr == f {
				fn := fn
				got = &fn
			}
		}
		if got == nil {
			t.Fatal("f not recorded")
		}
		want := Func{Entries: 2, Exits: 2, Orphans: 1, Unmatched: 1, Samples: 1}
		if !bump {
			want = Func{Entries: 2, Exits: 2, Orphans: 0, Unmatched: 0, Samples: 2}
		}
		if !c.mode.clock {
			want.Samples = 0
		}
		if got.Entries != want.Entries || got.Exits != want.Exits || got.Orphans != want.Orphans ||
			got.Unmatched != want.Unmatched || got.Samples != want.Samples {
			t.Errorf("bump=%v%s: entries %d exits %d orphans %d unmatched %d samples %d; want %d %d %d %d %d", bump, c.mode.suffix,
				got.Entries, got.Exits, got.Orphans, got.Unmatched, got.Samples,
				want.Entries, want.Exits, want.Orphans, want.Unmatched, want.Samples)
		}
		r.Close()
	}
}
