package shm

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestLatencyBounds checks what the timed hooks record (their common case is
// assembly, D33: the clock reads, the hinted histogram, the sum, and the C
// tail for a new minimum or maximum) against what the program measured of
// itself: timed() spins 20, 40, 60, 80 and 100 µs in turn, so every recorded
// latency is at least the one the program saw inside the call, and a
// preempted call only moves up. Per build (gcc and clang, -O0 and -O2):
// every call counted and timed, min >= the program's min, max >= its max,
// sum >= its sum, no sample below the 20 µs bucket, at most a fifth of them
// in it and at most three fifths up to the 60 µs one; leaf()'s 100,000
// calls all timed. With EDGEPROBE_TIMING=0 the same counts and no sample.
func TestLatencyBounds(t *testing.T) {
	const n, m = 500, 100000
	for _, cc := range []string{"gcc", "clang"} {
		testutil.RequireTool(t, cc)
		lib := buildRuntime(t, cc)
		for _, opt := range []string{"-O0", "-O2"} {
			bin := testutil.Build(t, testutil.Spec{Compiler: cc, Opt: opt, Sources: []string{"latency.c"}}).Path
			for _, timing := range []string{"1", "0"} {
				t.Run(fmt.Sprintf("%s%s/timing=%s", cc, opt, timing), func(t *testing.T) {
					out := filepath.Join(t.TempDir(), "out")
					got := mustRun(t, lib, bin, []string{"EDGEPROBE_OUTPUT=" + out, "EDGEPROBE_TIMING=" + timing},
						fmt.Sprint(n), fmt.Sprint(m))
					var gn, min, max, sum, gm int64
					if _, err := fmt.Sscanf(got, "inner n=%d min=%d max=%d sum=%d leaf=%d\n", &gn, &min, &max, &sum, &gm); err != nil || gn != n || gm != m {
						t.Fatalf("program said %q (%v)", got, err)
					}
					r := openOutput(t, out)
					funcs := byName(t, r, r.Maps())
					checkCounts(t, funcs, map[string]ee{"timed": {n, n}, "leaf": {m, m}})
					tf, lf := funcs["timed"], funcs["leaf"]
					if timing == "0" {
						if tf.Samples != 0 || tf.SumNs != 0 || lf.Samples != 0 || lf.SumNs != 0 {
							t.Errorf("count only, yet samples timed %d (sum %d) leaf %d (sum %d)", tf.Samples, tf.SumNs, lf.Samples, lf.SumNs)
						}
						return
					}
					if tf.Samples != n || lf.Samples != m {
						t.Errorf("samples: timed %d of %d calls, leaf %d of %d", tf.Samples, n, lf.Samples, m)
					}
					if int64(tf.MinNs) < min || int64(tf.MaxNs) < max || int64(tf.SumNs) < sum {
						t.Errorf("timed: recorded min %d max %d sum %d ns, the program measured inside min %d max %d sum %d",
							tf.MinNs, tf.MaxNs, tf.SumNs, min, max, sum)
					}
					if lf.MinNs > lf.MaxNs || lf.MaxNs == 0 && lf.SumNs != 0 {
						t.Errorf("leaf: min %d max %d sum %d", lf.MinNs, lf.MaxNs, lf.SumNs)
					}
					const b20 = 14 // [16384, 32768) ns holds 20 µs; 40 and 60 µs are in 15
					var below, upTo20, upTo60 uint64
					for b, c := range tf.Hist {
						switch {
						case b < b20:
							below += c
						case b == b20:
							upTo20 += c
						}
						if b <= b20+1 {
							upTo60 += c
						}
					}
					if below != 0 || upTo20 > n/5 || upTo60 > 3*n/5 {
						t.Errorf("timed's histogram: %d samples below 16 µs, %d in [16, 32) µs (at most %d), %d below 64 µs (at most %d): %v",
							below, upTo20, n/5, upTo60, 3*n/5, tf.Hist[:20])
					}
				})
			}
		}
	}
}
