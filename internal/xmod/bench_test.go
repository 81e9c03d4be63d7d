package xmod_test

import (
	"context"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// BenchmarkToggle measures one toggle (one site, alternately off and on)
// per protocol against a running four-executor stress fixture, and reports
// each as a ratio ("x-pwrite") to a bare 1-byte pwrite to /proc/PID/mem
// measured in the same run.
func BenchmarkToggle(b *testing.B) {
	st := startStress(b, buildStress(b, true), 4, false)
	flipSites := st.sites(b, true)
	nopSites := st.sites(b, false)
	ctx := context.Background()

	// The baseline: rewrite byte 0 of the non-straddling site with its own value.
	one := flipSites[0].Active[:1]
	base := func(n int) time.Duration {
		start := time.Now()
		for i := 0; i < n; i++ {
			if err := st.mem.WriteMem(flipSites[0].Addr, one); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start) / time.Duration(n)
	}
	base(1000) // warm: the copy-on-write of the text page happens here
	baseline := base(20000)
	b.Logf("baseline 1-byte pwrite: %v", baseline)

	run := func(name string, traced bool, sites []xmod.Site, fn func(tr *ptrace.Tracer, m xmod.Mem, cs []xmod.Change) error) {
		b.Run(name, func(b *testing.B) {
			var tr *ptrace.Tracer
			var m xmod.Mem = st.mem
			if traced {
				tr = attach(b, st.pid)
				m = tr
				defer tr.Detach()
			}
			off, on := changes(sites, false), changes(sites, true)
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				cs := off
				if i%2 == 1 {
					cs = on
				}
				if err := fn(tr, m, cs); err != nil {
					b.Fatal(err)
				}
			}
			per := time.Since(start) / time.Duration(b.N)
			b.StopTimer()
			if i := b.N; i%2 == 1 { // leave the sites active
				_ = fn(tr, m, on)
			}
			b.ReportMetric(float64(per)/float64(baseline), "x-pwrite")
		})
	}
	flip := func(opts xmod.FlipOptions) func(*ptrace.Tracer, xmod.Mem, []xmod.Change) error {
		return func(_ *ptrace.Tracer, m xmod.Mem, cs []xmod.Change) error {
			_, err := xmod.Flip(ctx, m, cs, opts)
			return err
		}
	}
	int3 := func(opts xmod.Int3Options) func(*ptrace.Tracer, xmod.Mem, []xmod.Change) error {
		return func(tr *ptrace.Tracer, _ xmod.Mem, cs []xmod.Change) error {
			_, err := xmod.Int3(ctx, tr, cs, opts)
			return err
		}
	}
	async := func(tr *ptrace.Tracer, _ xmod.Mem, cs []xmod.Change) error {
		a := xmod.NewAsync(tr, xmod.Int3Options{})
		if _, err := a.Start(ctx, cs); err != nil {
			return err
		}
		return a.Drain(ctx)
	}
	stop := func(tr *ptrace.Tracer, _ xmod.Mem, cs []xmod.Change) error {
		_, err := xmod.Stop(ctx, tr, cs, xmod.StopOptions{})
		return err
	}

	run("pwrite-baseline", false, flipSites[:1], func(_ *ptrace.Tracer, m xmod.Mem, _ []xmod.Change) error {
		return m.WriteMem(flipSites[0].Addr, one)
	})
	run("flip", false, flipSites[1:2], flip(xmod.FlipOptions{}))
	run("flip-traced", true, flipSites[1:2], flip(xmod.FlipOptions{}))
	run("int3", true, nopSites[1:2], int3(xmod.Int3Options{}))
	run("int3-nosync-50us", true, nopSites[1:2], int3(xmod.Int3Options{NoSync: true}))
	run("int3-wait0-sync", true, nopSites[1:2], int3(xmod.Int3Options{Wait: -1}))
	run("int3-async", true, nopSites[1:2], async)
	run("stop", true, nopSites[1:2], stop)
	// Batches of the five sites, which share a page: per-site writes vs
	// one coalesced span.
	run("flip-5sites", false, flipSites, flip(xmod.FlipOptions{}))
	run("flip-5sites-coalesced", false, flipSites, flip(xmod.FlipOptions{Coalesce: true}))
	run("int3-5sites", true, nopSites, int3(xmod.Int3Options{}))
	run("stop-5sites", true, nopSites, stop)
}
