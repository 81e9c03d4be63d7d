package elfscan

import (
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// gen20k writes a C file with 20,000 instrumented functions, a third of
// them small static helpers that -O2 inlines (so hook sites name inlined
// callees), and returns its path relative to the fixture directory, as
// testutil.Build wants. The name carries a hash of the contents, so the
// build cache can never serve a stale binary.
// BenchmarkScan20k scans a 20,000-function -O2 build; bytes are the
// function bytes decoded.
func BenchmarkScan20k(b *testing.B) {
	fx := testutil.Build(b, testutil.Spec{Sources: []string{testutil.Generated(b, "gen20k", testutil.Program20k())}, Opt: "-O2", Name: "gen20k"})
	l, rep, err := Scan(fx.Path, Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(rep.TextBytes)
	b.ReportMetric(float64(len(l.Probes)), "probes")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, _, err := Scan(fx.Path, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
