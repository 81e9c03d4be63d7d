package coldpatch

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// BenchmarkColdpatch20k makes the 20,000-function program cold: scan, verify,
// rewrite, rescan (the self-check) and write. Bytes are the decoded function
// bytes, so MB/s is per MB of .text.
func BenchmarkColdpatch20k(b *testing.B) {
	fx := testutil.Build(b, testutil.Spec{Sources: []string{testutil.Generated(b, "gen20k", testutil.Program20k())}, Opt: "-O2", Name: "gen20k"})
	out := filepath.Join(b.TempDir(), "cold")
	res, err := Run(fx.Path, Options{Output: out, DryRun: true})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(res.Report.TextBytes)
	b.ReportMetric(float64(len(res.List.Probes)), "probes")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		os.Remove(out)
		if _, err := Run(fx.Path, Options{Output: out}); err != nil {
			b.Fatal(err)
		}
	}
}
