package xmod

import (
	"context"
	"errors"
	"math/rand"
	"testing"
)

// Prepared.Classify agrees with Classify on every state, site length and
// order: the word compare is only a faster bytes.Equal.
func TestPreparedClassifyMatchesClassify(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	const base = 0x40000
	mem := make([]byte, 3*DefaultMaxSpan)
	for i := range mem {
		mem[i] = byte(rng.Intn(256))
	}
	var sites []Site
	for a := uint64(3); a < uint64(len(mem))-16; a += uint64(16 + rng.Intn(200)) {
		n := 1 + rng.Intn(15)
		act := make([]byte, n)
		rng.Read(act)
		in := append([]byte(nil), act...)
		in[rng.Intn(n)] ^= 0x55
		s := Site{Addr: base + a, Active: act, Inert: in}
		switch rng.Intn(4) {
		case 0:
			copy(mem[a:], act)
		case 1:
			copy(mem[a:], in)
		case 2: // torn: an int3 over its own bytes
			copy(mem[a:], in)
			mem[a] = int3
		} // 3: whatever was there (neither form)
		sites = append(sites, s)
	}
	// The sites out of address order, at the end of the memory too (a run
	// ending within 8 bytes of its buffer's end).
	rng.Shuffle(len(sites), func(i, j int) { sites[i], sites[j] = sites[j], sites[i] })
	m := &fakeMem{base: base, b: mem}
	want, err := Classify(m, sites)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Prepare(all(sites, true))
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Classify(m, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[State]int{}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("site %d (%d bytes at %#x): Prepared.Classify says %v, Classify %v", i, sites[i].Len(), sites[i].Addr, got[i], want[i])
		}
		seen[want[i]]++
	}
	if len(seen) != 4 {
		t.Fatalf("states covered: %v; want all four", seen)
	}
}

// Prepared.Flip writes only the sites not already in the asked form, as
// checked spans with a Pristine, and refuses before any write a state that
// is neither form.
func TestPreparedFlip(t *testing.T) {
	for _, spans := range []bool{false, true} {
		m, pr, sites := spanFixture()
		copy(m.b[sites[5].Addr-m.base:], sites[5].Active) // already on
		// The file as the fixture's memory now is (site 5 on): pristine.
		pr.file = append([]byte(nil), m.b...)
		p, err := Prepare(all(sites, true))
		if err != nil {
			t.Fatal(err)
		}
		if !p.Flippable() || p.Len() != 64 {
			t.Fatalf("Flippable %v, Len %d", p.Flippable(), p.Len())
		}
		st, err := p.Classify(m, nil)
		if err != nil {
			t.Fatal(err)
		}
		opts := FlipOptions{}
		stats := &SpanStats{}
		if spans {
			opts = FlipOptions{Pristine: pr, Stats: stats}
		}
		m.reads, m.wrote = 0, 0
		res, err := p.Flip(context.Background(), m, st, opts)
		if err != nil || res.Changed != 63 || res.Unchanged != 1 {
			t.Fatalf("spans=%v: %+v, %v", spans, res, err)
		}
		if spans && (stats.Spans != 1 || stats.SpanSites != 63 || m.wrote != 1 || m.reads != 2) {
			// One span over all 64 (site 5 rewritten with the byte just
			// re-read): re-read, written, read back; no plan read.
			t.Fatalf("spans: stats %+v, %d reads, %d writes", stats, m.reads, m.wrote)
		}
		if !spans && (m.wrote != 63 || m.reads != 0) {
			t.Fatalf("one byte per site: %d reads, %d writes; want no read, 63 writes", m.reads, m.wrote)
		}
		expectAll(t, m, sites, true)
		// A state that is neither form: nothing written.
		st2, _ := p.Classify(m, nil)
		st2[7] = StateTorn
		m.wrote = 0
		if _, err := p.Flip(context.Background(), m, st2, FlipOptions{}); !errors.Is(err, ErrNotClassified) || m.wrote != 0 {
			t.Fatalf("torn state: %v, %d writes", err, m.wrote)
		}
	}
}

// Prepare refuses what every protocol refuses: overlapping sites, bad forms.
func TestPrepareRefuses(t *testing.T) {
	a := Site{Addr: 0x1000, Active: []byte{0xe8, 1, 2, 3, 4}, Inert: []byte{0x3d, 1, 2, 3, 4}}
	b := a
	b.Addr += 2
	if _, err := Prepare([]Change{{Site: b}, {Site: a}}); !errors.Is(err, ErrInvalidSite) {
		t.Fatalf("overlap: %v", err)
	}
	c := a
	c.Inert = c.Active
	if _, err := Prepare([]Change{{Site: c}}); !errors.Is(err, ErrInvalidSite) {
		t.Fatalf("equal forms: %v", err)
	}
	n := Site{Addr: 0x2000, Active: []byte{0xe8, 1, 2, 3, 4}, Inert: []byte{0x0f, 0x1f, 0x44, 0, 0}}
	p, err := Prepare([]Change{{Site: n, On: true}})
	if err != nil || p.Flippable() {
		t.Fatalf("nop site: %v, flippable %v", err, p != nil && p.Flippable())
	}
	if _, err := p.Flip(context.Background(), &fakeMem{base: 0x2000, b: make([]byte, 16)}, []State{StateInert}, FlipOptions{}); !errors.Is(err, ErrNotFlippable) {
		t.Fatalf("Flip of a nop site: %v", err)
	}
}

// ClassifyAfterFlip does not read again the sites a span's clean read-back
// confirmed, and reads every other one: sites written one byte at a time
// (here: a run that fell back because of a foreign byte), and every site
// after a Flip that failed.
func TestClassifyAfterFlip(t *testing.T) {
	m, pr, sites := spanFixture()
	p, err := Prepare(all(sites, true))
	if err != nil {
		t.Fatal(err)
	}
	st, _ := p.Classify(m, nil)
	if _, err := p.Flip(context.Background(), m, st, FlipOptions{Pristine: pr}); err != nil {
		t.Fatal(err)
	}
	m.reads = 0
	after, err := p.ClassifyAfterFlip(m, nil)
	if err != nil || m.reads != 0 {
		t.Fatalf("after a clean span: %v, %d reads; want none", err, m.reads)
	}
	for i, s := range after {
		if s != StateActive {
			t.Fatalf("site %d: %v", i, s)
		}
	}
	// A foreign byte between the sites: one-byte writes, nothing confirmed;
	// a site undone after the Flip shows.
	m, pr, sites = spanFixture()
	m.b[256+8*10+6] = 0xcc
	p, _ = Prepare(all(sites, true))
	st, _ = p.Classify(m, nil)
	if _, err := p.Flip(context.Background(), m, st, FlipOptions{Pristine: pr}); err != nil {
		t.Fatal(err)
	}
	copy(m.b[sites[9].Addr-m.base:], sites[9].Inert)
	m.reads = 0
	after, err = p.ClassifyAfterFlip(m, nil)
	if err != nil || m.reads == 0 || after[9] != StateInert || after[8] != StateActive {
		t.Fatalf("after one-byte writes: %v, %d reads, site 9 %v, site 8 %v", err, m.reads, after[9], after[8])
	}
	// A Flip that fails (a state in neither form), after one that
	// confirmed every site, leaves nothing confirmed.
	m, pr, sites = spanFixture()
	p, _ = Prepare(all(sites, true))
	st, _ = p.Classify(m, nil)
	if _, err := p.Flip(context.Background(), m, st, FlipOptions{Pristine: pr}); err != nil {
		t.Fatal(err)
	}
	st[3] = StateTorn
	if _, err := p.Flip(context.Background(), m, st, FlipOptions{Pristine: pr}); err == nil {
		t.Fatal("Flip of a torn state succeeded")
	}
	m.reads = 0
	if _, err := p.ClassifyAfterFlip(m, nil); err != nil || m.reads == 0 {
		t.Fatalf("after a failed Flip: %v, %d reads", err, m.reads)
	}
}
