package xmod

import (
	"bytes"
	"context"
	"syscall"
	"testing"
)

// overlayPristine is hotpatch's check in miniature: the file's bytes with
// the batch's sites laid over them must equal the span.
type overlayPristine struct {
	base    uint64
	file    []byte
	scratch []byte
}

func (p *overlayPristine) Extent(addr uint64) (uint64, bool) {
	return p.base + uint64(len(p.file)), true
}

// File and Identity: as hotpatch's (PristineFile, PristineIdentity).
func (p *overlayPristine) File(addr uint64, b []byte) error {
	copy(b, p.file[addr-p.base:])
	return nil
}

func (p *overlayPristine) Identity() string { return "one mapping" }

func (p *overlayPristine) Check(addr uint64, cur []byte, ours []Extent) error {
	f := append(p.scratch[:0], p.file[addr-p.base:addr-p.base+uint64(len(cur))]...)
	p.scratch = f
	for _, o := range ours {
		off := o.Addr - addr
		copy(f[off:off+uint64(o.Len)], cur[off:])
	}
	if !bytes.Equal(f, cur) {
		return ErrUnexpectedBytes
	}
	return nil
}

// BenchmarkPreparedBatch is the Go side of a session's 40,000-site batch
// (row 2b) without the kernel: memory is a byte slice. Each op is what
// hotpatch.Session.Apply does to a flip-only selection: the grouped read,
// the flip as checked spans, the read after. ns/site is per site per op.
// first: each op a selection's first (its images dropped: one hotpatch
// call); kept: toggled back and forth, the images kept (D61).
func BenchmarkPreparedBatch(b *testing.B) {
	for _, first := range []bool{true, false} {
		name := "kept"
		if first {
			name = "first"
		}
		b.Run(name, func(b *testing.B) { benchPreparedBatch(b, first) })
	}
}

func benchPreparedBatch(b *testing.B, first bool) {
	const n, gap, base = 40_000, 27, 0x100000
	mem := bytes.Repeat([]byte{0x90}, n*gap+64)
	var sites []Site
	for i := 0; i < n; i++ {
		s := Site{Addr: base + 16 + uint64(i)*gap, Active: []byte{0xe8, 1, 2, 3, 4}, Inert: []byte{0x3d, 1, 2, 3, 4}}
		copy(mem[s.Addr-base:], s.Inert)
		sites = append(sites, s)
	}
	m := &fakeMem{base: base, b: mem}
	pr := &overlayPristine{base: base, file: append([]byte(nil), mem...)}
	on, err := Prepare(all(sites, true))
	if err != nil {
		b.Fatal(err)
	}
	off, err := Prepare(all(sites, false))
	if err != nil {
		b.Fatal(err)
	}
	on.KeepImages(true)
	off.KeepImages(true)
	scratch := make([]byte, 3*(DefaultMaxSpan+16))
	var before, after []State
	ctx := context.Background()
	var r0, r1 syscall.Rusage
	b.ResetTimer()
	syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	for i := 0; i < b.N; i++ {
		p := on
		if i%2 == 1 {
			p = off
		}
		if first {
			p.DropImages()
		}
		if before, err = p.Classify(m, before); err != nil {
			b.Fatal(err)
		}
		st := &SpanStats{}
		r, err := p.Flip(ctx, m, before, FlipOptions{Pristine: pr, Stats: st, Scratch: scratch})
		if err != nil || r.Changed != n || st.SpanSites != n {
			b.Fatalf("flip: %+v %+v %v", r, st, err)
		}
		if after, err = p.ClassifyAfterFlip(m, after); err != nil {
			b.Fatal(err)
		}
		for _, s := range after {
			if s != stateOf(i%2 == 0) {
				b.Fatalf("after: %v", s)
			}
		}
	}
	syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/site")
	// Under load, CPU time says more than wall time.
	cpu := func(r syscall.Rusage) float64 { return float64(r.Utime.Nano() + r.Stime.Nano()) }
	b.ReportMetric((cpu(r1)-cpu(r0))/float64(b.N)/n, "cpu-ns/site")
}
