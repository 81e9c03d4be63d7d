package shm

import (
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// BenchmarkFentryCost runs testdata/fixtures/bench.c (an empty probed
// function called in a loop) in every configuration in the same run and
// reports ns per call, and ratios to glibc's __fentry__ (a bare ret) and to
// the cyg provider:
//
//	uninstr        built without instrumentation
//	fentry-ret     -pg -mfentry, a preloaded __fentry__ that is a bare ret
//	fentry-glibc   -pg -mfentry, glibc's __fentry__ (no preload: it calls
//	               __mcount_internal, a cmpxchg on shared state)
//	fentry-entry   runtime, count-only, entries only (EDGEPROBE_FENTRY_EXITS=0)
//	fentry-exit    runtime, count-only, entries and hijacked exits
//	fentry-timed   runtime, entries and exits with latency (default)
//	cyg-glibc      -finstrument-functions, glibc's empty hooks
//	cyg-count      runtime, count-only
//	cyg-timed      runtime, latency (default)
//
// and for two threads calling the same function.
//
//	go test -run XXX -bench FentryCost -benchtime 3x ./internal/shm/
func BenchmarkFentryCost(b *testing.B) {
	requireAVX(b) // not needed by bench.c; keeps the skip rules of the fentry tests
	lib := buildRuntime(b, "gcc")
	plain := testutil.Build(b, testutil.Spec{Sources: []string{"bench.c"}, NoInstr: true}).Path
	fentry := testutil.Build(b, testutil.Spec{Sources: []string{"bench.c"}, NoInstr: true, Profile: testutil.ProfileFentry, Name: "bench-fentry"}).Path
	cyg := testutil.Build(b, testutil.Spec{Sources: []string{"bench.c"}}).Path
	ret := testutil.Build(b, testutil.Spec{Sources: []string{"fentry_ret.S"}, Shared: true, NoInstr: true, Name: "libfentry_ret.so"}).Path
	modes := []costMode{
		{"uninstr", plain, "", nil},
		{"fentry-ret", fentry, ret, nil},
		{"fentry-glibc", fentry, "", nil},
		{"fentry-entry", fentry, lib, []string{"EDGEPROBE_TIMING=0", "EDGEPROBE_FENTRY_EXITS=0"}},
		{"fentry-exit", fentry, lib, []string{"EDGEPROBE_TIMING=0"}},
		{"fentry-timed", fentry, lib, nil},
		{"cyg-glibc", cyg, "", nil},
		{"cyg-count", cyg, lib, []string{"EDGEPROBE_TIMING=0"}},
		{"cyg-timed", cyg, lib, nil},
	}
	best := bestNsPerCall(b, modes, func(name string) bool { return name == "uninstr" })
	for _, t := range []string{"1T", "2T"} {
		for _, k := range []string{"fentry-entry", "fentry-exit", "fentry-timed"} {
			b.ReportMetric(best[k+"-"+t]/best["fentry-ret-"+t], "x-fentry-ret-"+k+"-"+t)
			b.ReportMetric(best[k+"-"+t]-best["fentry-ret-"+t], "ns-over-fentry-ret-"+k+"-"+t)
			b.ReportMetric(best[k+"-"+t]/best["fentry-glibc-"+t], "x-fentry-glibc-"+k+"-"+t)
		}
		b.ReportMetric(best["fentry-exit-"+t]/best["cyg-count-"+t], "x-cyg-count-fentry-exit-"+t)
		b.ReportMetric(best["fentry-timed-"+t]/best["cyg-timed-"+t], "x-cyg-timed-fentry-timed-"+t)
	}
	b.ReportMetric(best["fentry-ret-1T"]/best["uninstr-1T"], "x-uninstr-fentry-ret-1T")
	b.ReportMetric(best["fentry-glibc-1T"]/best["uninstr-1T"], "x-uninstr-fentry-glibc-1T")
	b.ReportMetric(best["fentry-exit-1T"]/best["uninstr-1T"], "x-uninstr-fentry-exit-1T")
}
