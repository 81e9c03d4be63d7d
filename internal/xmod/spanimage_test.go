package xmod

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"testing"
)

// idPristine is filePristine with an identity and a count of its checks.
type idPristine struct {
	filePristine
	id     string
	checks *int
}

func (p idPristine) Check(addr uint64, cur []byte, ours []Extent) error {
	*p.checks++
	return p.filePristine.Check(addr, cur, ours)
}

func (p idPristine) Identity() string { return p.id }

// A Prepared's span images (D61): from its second flip on, a span that
// reads exactly as it was checked last time is written as it was then,
// without the check; a span that differs anywhere (a foreign store outside
// the sites, another probe of the list toggled) is checked as before, and a
// span whose write raced, or a Pristine of another identity, starts over.
func TestSpanImages(t *testing.T) {
	ctx := context.Background()
	m, fp, sites := spanFixture()
	checks := 0
	pr := idPristine{filePristine: fp, id: "maps 1", checks: &checks}
	on, err := Prepare(all(sites, true))
	if err != nil {
		t.Fatal(err)
	}
	off, err := Prepare(all(sites, false))
	if err != nil {
		t.Fatal(err)
	}
	on.KeepImages(true)
	off.KeepImages(true)
	// apply flips p and reports how many checks it made, with its stats.
	apply := func(p *Prepared, want bool) (int, *SpanStats) {
		t.Helper()
		st, err := p.Classify(m, nil)
		if err != nil {
			t.Fatal(err)
		}
		checks = 0
		stats := &SpanStats{}
		res, err := p.Flip(ctx, m, st, FlipOptions{Pristine: pr, Stats: stats})
		if err != nil || res.Changed != len(sites) {
			t.Fatalf("flip to %v: %+v, %v", want, res, err)
		}
		expectAll(t, m, sites, want)
		return checks, stats
	}
	// The first flip of each keeps no image (a selection applied once), the
	// second keeps one, the third uses it.
	for round, wantChecks := range []int{1, 1, 0, 0} {
		if c, st := apply(on, true); c != wantChecks || st.Spans != 1 || st.SpanSites != len(sites) {
			t.Fatalf("round %d, on: %d checks (want %d), stats %+v", round, c, wantChecks, st)
		}
		if c, _ := apply(off, false); c != wantChecks {
			t.Fatalf("round %d, off: %d checks, want %d", round, c, wantChecks)
		}
	}
	if on.ImageBytes() == 0 || off.ImageBytes() == 0 {
		t.Fatalf("image bytes %d, %d", on.ImageBytes(), off.ImageBytes())
	}
	// What a hit writes is what a check would have: the file's bytes with
	// every site's byte flipped.
	want := append([]byte(nil), fp.file...)
	for _, s := range sites {
		copy(want[s.Addr-m.base:], s.Active)
	}
	apply(on, true)
	if !bytes.Equal(m.b, want) {
		t.Fatal("memory after a flip from the image is not the file with every site on")
	}
	apply(off, false)

	// A foreign store between two sites: the image no longer matches, the
	// check runs and refuses the span, the store is not undone.
	gap := sites[10].Addr + 5 - m.base
	m.b[gap] = 0xcc
	c, st := apply(on, true)
	if c != 1 || len(st.Fallbacks) != 1 || st.OneByte != len(sites) || m.b[gap] != 0xcc {
		t.Fatalf("foreign store: %d checks, stats %+v, byte %#x", c, st, m.b[gap])
	}
	m.b[gap] = fp.file[gap] // the writer put it back
	apply(off, false)

	// A store racing the write of a span made from its image: reported,
	// and the image dropped (the next flip checks again).
	apply(on, true)
	m.afterWrite = func(f *fakeMem) {
		f.b[gap] = 0xcc
		f.afterWrite = nil
	}
	st0, _ := off.Classify(m, nil)
	stats := &SpanStats{}
	checks = 0
	if _, err := off.Flip(ctx, m, st0, FlipOptions{Pristine: pr, Stats: stats}); err != nil {
		t.Fatal(err)
	}
	if checks != 0 || len(stats.Raced) != 1 {
		t.Fatalf("race on an image's write: %d checks, stats %+v", checks, stats)
	}
	m.b[gap] = fp.file[gap]
	apply(on, true)
	if c, _ := apply(off, false); c != 1 {
		t.Fatalf("after a race: %d checks, want 1 (image dropped)", c)
	}

	// Another identity (the maps changed): every image starts over.
	pr.id = "maps 2"
	if c, _ := apply(on, true); c != 1 {
		t.Fatalf("new identity: %d checks, want 1", c)
	}
	on.DropImages()
	if on.ImageBytes() != 0 {
		t.Fatal("DropImages kept bytes")
	}

	// A Pristine without an identity: no images, every span checked.
	plain, err := Prepare(all(sites, false))
	if err != nil {
		t.Fatal(err)
	}
	plain.KeepImages(true)
	for i := 0; i < 3; i++ {
		st, _ := plain.Classify(m, nil)
		if _, err := plain.Flip(ctx, m, st, FlipOptions{Pristine: fp}); err != nil {
			t.Fatal(err)
		}
		if plain.images != nil {
			t.Fatal("span images kept for a Pristine without identity")
		}
		st, _ = on.Classify(m, nil)
		if _, err := on.Flip(ctx, m, st, FlipOptions{Pristine: fp}); err != nil {
			t.Fatal(err)
		}
	}
}

// A Prepared's classify memo (D61) gives the states Classify would, read
// after read, whatever changed in between (a site toggled, made foreign or
// torn, a byte outside the sites); the read itself is made every time.
func TestClassifyMemo(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	const base = 0x40000
	mem := make([]byte, 3*MaxRead)
	rng.Read(mem)
	var sites []Site
	for a := uint64(5); a < uint64(len(mem))-16; a += uint64(13 + rng.Intn(40)) {
		n := 1 + rng.Intn(12)
		act := make([]byte, n)
		rng.Read(act)
		in := append([]byte(nil), act...)
		in[rng.Intn(n)] ^= 0x21
		copy(mem[a:], in)
		sites = append(sites, Site{Addr: base + a, Active: act, Inert: in})
	}
	rng.Shuffle(len(sites), func(i, j int) { sites[i], sites[j] = sites[j], sites[i] })
	m := &fakeMem{base: base, b: mem}
	p, err := Prepare(all(sites, true))
	if err != nil {
		t.Fatal(err)
	}
	p.KeepImages(true)
	var got []State
	for round := 0; round < 40; round++ {
		switch round % 4 {
		case 1: // unchanged: from the memo
		case 2: // a few sites toggled, torn or foreign
			for k := 0; k < 5; k++ {
				s := sites[rng.Intn(len(sites))]
				switch rng.Intn(4) {
				case 0:
					copy(m.b[s.Addr-base:], s.Active)
				case 1:
					copy(m.b[s.Addr-base:], s.Inert)
				case 2:
					m.b[s.Addr-base] = int3
				case 3:
					m.b[s.Addr-base+uint64(rng.Intn(s.Len()))] ^= 0xff
				}
			}
		default: // one byte anywhere
			m.b[rng.Intn(len(m.b))] ^= byte(1 + rng.Intn(255))
		}
		want, err := Classify(m, sites)
		if err != nil {
			t.Fatal(err)
		}
		reads := m.reads
		if got, err = p.Classify(m, got); err != nil {
			t.Fatal(err)
		}
		if m.reads == reads {
			t.Fatalf("round %d: Classify made no read", round)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("round %d, site %d: %v, want %v", round, i, got[i], want[i])
			}
		}
	}
	if p.memo == nil || p.ImageBytes() == 0 || p.memo.hits < 9 {
		t.Fatalf("memo %v, %d bytes: want one, used in the 10 rounds where nothing changed", p.memo != nil, p.ImageBytes())
	}
	p.DropImages()
	if p.memo != nil || p.ImageBytes() != 0 {
		t.Fatal("DropImages kept the memo")
	}
}

// filePristineFile is filePristine that also reads its file (PristineFile),
// counting reads and checks.
type filePristineFile struct {
	filePristine
	files, checks *int
}

func (p filePristineFile) File(addr uint64, b []byte) error {
	*p.files++
	if addr < p.base || addr+uint64(len(b)) > p.base+uint64(len(p.file)) {
		return errors.New("not in the mapping")
	}
	copy(b, p.file[addr-p.base:])
	return nil
}

func (p filePristineFile) Check(addr uint64, cur []byte, ours []Extent) error {
	*p.checks++
	return p.filePristine.Check(addr, cur, ours)
}

// A Prepared's span against a PristineFile is checked in one pass over its
// sites (buildFile): a span equal to the file but at the batch's sites is
// written without Check; one that differs elsewhere asks Check, which
// lets other probe sites in either form pass and refuses anything else
// (the run then one byte per site, the foreign byte kept).
func TestSpanBuildFile(t *testing.T) {
	ctx := context.Background()
	m, fp, sites := spanFixture()
	var files, checks int
	pr := filePristineFile{filePristine: fp, files: &files, checks: &checks}
	var even []Site // the batch; the odd sites are other probes of the list
	for i := 0; i < len(sites); i += 2 {
		even = append(even, sites[i])
	}
	flip := func(on bool) *SpanStats {
		t.Helper()
		p, err := Prepare(all(even, on))
		if err != nil {
			t.Fatal(err)
		}
		st, err := p.Classify(m, nil)
		if err != nil {
			t.Fatal(err)
		}
		files, checks = 0, 0
		stats := &SpanStats{}
		if _, err := p.Flip(ctx, m, st, FlipOptions{Pristine: pr, Stats: stats}); err != nil {
			t.Fatal(err)
		}
		expectAll(t, m, even, on)
		return stats
	}
	if st := flip(true); files != 1 || checks != 0 || st.Spans != 1 || st.SpanSites != len(even) {
		t.Fatalf("untouched span: %d file reads, %d checks, stats %+v", files, checks, st)
	}
	// Another probe of the list (odd) on: Check is asked and lets it pass.
	odd := sites[7]
	copy(m.b[odd.Addr-m.base:], odd.Active)
	if st := flip(false); checks != 1 || st.Spans != 1 || len(st.Fallbacks) != 0 {
		t.Fatalf("another probe on: %d checks, stats %+v", checks, st)
	}
	if !bytes.Equal(m.b[odd.Addr-m.base:][:odd.Len()], odd.Active) {
		t.Fatal("the other probe's site was changed")
	}
	// A foreign byte between sites: refused, one byte per site, kept.
	gap := sites[20].Addr + 5 - m.base
	m.b[gap] = 0xcc
	if st := flip(true); checks != 1 || len(st.Fallbacks) != 1 || st.OneByte != len(even) || m.b[gap] != 0xcc {
		t.Fatalf("foreign byte: %d checks, stats %+v, byte %#x", checks, st, m.b[gap])
	}
	// A site that changed since the batch's read: the batch fails, nothing
	// of that span written.
	m.b[gap] = fp.file[gap]
	p, err := Prepare(all(even, false))
	if err != nil {
		t.Fatal(err)
	}
	st, _ := p.Classify(m, nil)
	m.b[even[3].Addr-m.base] = 0x90
	before := append([]byte(nil), m.b...)
	if _, err := p.Flip(ctx, m, st, FlipOptions{Pristine: pr}); !errors.Is(err, ErrUnexpectedBytes) || !bytes.Equal(m.b, before) {
		t.Fatalf("a site changed under the batch: %v, memory changed %v", err, !bytes.Equal(m.b, before))
	}
}
