package xmod

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// fakeMem is memory at base, with a hook run after each write (a writer in
// the target racing us) and a count of calls.
type fakeMem struct {
	base         uint64
	b            []byte
	afterWrite   func(f *fakeMem)
	reads, wrote int
}

func (f *fakeMem) ReadMem(addr uint64, b []byte) error {
	f.reads++
	copy(b, f.b[addr-f.base:])
	return nil
}

func (f *fakeMem) WriteMem(addr uint64, b []byte) error {
	f.wrote++
	copy(f.b[addr-f.base:], b)
	if f.afterWrite != nil {
		f.afterWrite(f)
	}
	return nil
}

// filePristine says the whole fake memory is one r-x mapping whose file
// bytes are file, with sites as the known probe sites.
type filePristine struct {
	base  uint64
	file  []byte
	sites []Site
}

func (p filePristine) Extent(addr uint64) (uint64, bool) { return p.base + uint64(len(p.file)), true }

func (p filePristine) Check(addr uint64, cur []byte, _ []Extent) error {
	for k := range cur {
		a := addr + uint64(k)
		if cur[k] == p.file[a-p.base] {
			continue
		}
		inSite := false
		for _, s := range p.sites {
			if a >= s.Addr && a < s.Addr+uint64(s.Len()) {
				inSite = true
			}
		}
		if !inSite {
			return errors.New("differs from the file")
		}
	}
	return nil
}

// spanFixture: 64 call sites 8 bytes apart in a 4 KiB page of nops, all
// inert (the file's form); the flip form changes byte 0 (0x0f -> 0xe8, as a
// cmp-placeholder would).
func spanFixture() (*fakeMem, filePristine, []Site) {
	const base = 0x10000
	mem := make([]byte, 4096)
	for i := range mem {
		mem[i] = 0x90
	}
	var sites []Site
	for i := 0; i < 64; i++ {
		s := Site{Addr: base + 256 + uint64(i)*8, Active: []byte{0xe8, 1, 2, 3, 4}, Inert: []byte{0x3d, 1, 2, 3, 4}}
		copy(mem[s.Addr-base:], s.Inert)
		sites = append(sites, s)
	}
	file := append([]byte(nil), mem...)
	return &fakeMem{base: base, b: mem}, filePristine{base: base, file: file, sites: sites}, sites
}

func all(sites []Site, on bool) []Change {
	cs := make([]Change, len(sites))
	for i, s := range sites {
		cs[i] = Change{Site: s, On: on}
	}
	return cs
}

func expectAll(t *testing.T, m *fakeMem, sites []Site, on bool) {
	t.Helper()
	st, err := Classify(m, sites)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range st {
		if (s == StateActive) != on || s == StateInvalid {
			t.Fatalf("site %d is %v", i, s)
		}
	}
}

func TestSpanWritesWhole(t *testing.T) {
	m, pr, sites := spanFixture()
	st := &SpanStats{}
	res, err := Flip(context.Background(), m, all(sites, true), FlipOptions{Pristine: pr, Stats: st})
	if err != nil || res.Changed != 64 {
		t.Fatalf("Flip: %+v, %v", res, err)
	}
	// One grouped read (the plan), one re-read, one write, one read-back.
	if st.Spans != 1 || st.SpanSites != 64 || st.OneByte != 0 || m.wrote != 1 || m.reads != 3 {
		t.Fatalf("stats %+v, %d reads, %d writes; want one span", st, m.reads, m.wrote)
	}
	expectAll(t, m, sites, true)
	// Again: nothing to do, nothing written.
	m.wrote = 0
	res, err = Flip(context.Background(), m, all(sites, true), FlipOptions{Pristine: pr})
	if err != nil || res.Unchanged != 64 || m.wrote != 0 {
		t.Fatalf("second Flip: %+v, %v, %d writes", res, err, m.wrote)
	}
}

// A byte between the sites that is not the file's (a writer was here
// before us): the run is written one byte per site, and that byte stays.
func TestSpanFallsBackOnForeignBytes(t *testing.T) {
	m, pr, sites := spanFixture()
	m.b[256+8*10+6] = 0xcc
	st := &SpanStats{}
	res, err := Flip(context.Background(), m, all(sites, true), FlipOptions{Pristine: pr, Stats: st})
	if err != nil || res.Changed != 64 {
		t.Fatalf("Flip: %+v, %v", res, err)
	}
	if st.Spans != 0 || st.OneByte != 64 || len(st.Fallbacks) != 1 || !strings.Contains(st.Fallbacks[0], "differs from the file") {
		t.Fatalf("stats %+v: want every site one byte at a time, one fallback", st)
	}
	if m.b[256+8*10+6] != 0xcc {
		t.Fatal("the foreign byte was overwritten")
	}
	expectAll(t, m, sites, true)
}

// A writer that stores into the span right after our write: the read-back
// sees it, the batch says so, the rest is written one byte per site, and
// the writer's byte stands.
func TestSpanReadBackRace(t *testing.T) {
	m, pr, sites := spanFixture()
	first := true
	m.afterWrite = func(f *fakeMem) {
		if first {
			first = false
			f.b[256+8*3+6] = 0xcc
		}
	}
	st := &SpanStats{}
	res, err := Flip(context.Background(), m, all(sites, true), FlipOptions{Pristine: pr, Stats: st, MaxSpan: 128})
	if err != nil || res.Changed != 64 {
		t.Fatalf("Flip: %+v, %v", res, err)
	}
	if len(st.Raced) != 1 || !strings.Contains(st.Raced[0], "read back 0xcc") || st.Spans != 1 || st.OneByte == 0 || st.SpanSites+st.OneByte != 64 {
		t.Fatalf("stats %+v: want one raced span, then one byte per site", st)
	}
	if m.b[256+8*3+6] != 0xcc {
		t.Fatal("the writer's byte was undone")
	}
	expectAll(t, m, sites, true)
}

// A writer that undoes one of our sites right after the write: that site is
// written again, alone.
func TestSpanReadBackUndoneSite(t *testing.T) {
	m, pr, sites := spanFixture()
	first := true
	m.afterWrite = func(f *fakeMem) {
		if first {
			first = false
			f.b[256] = 0x3d
		}
	}
	st := &SpanStats{}
	res, err := Flip(context.Background(), m, all(sites, true), FlipOptions{Pristine: pr, Stats: st})
	if err != nil || res.Changed != 64 || len(st.Raced) != 1 || st.SpanSites != 63 || st.OneByte != 1 {
		t.Fatalf("Flip: %+v, %v, stats %+v", res, err, st)
	}
	expectAll(t, m, sites, true)
}

// A site holding neither form refuses the whole batch before any write.
func TestSpanAllOrNothing(t *testing.T) {
	m, pr, sites := spanFixture()
	m.b[sites[40].Addr-m.base] = 0xcc
	_, err := Flip(context.Background(), m, all(sites, true), FlipOptions{Pristine: pr})
	var se *SiteError
	if !errors.As(err, &se) || se.Site.Addr != sites[40].Addr || m.wrote != 0 {
		t.Fatalf("Flip: %v, %d writes; want a SiteError for site 40 and nothing written", err, m.wrote)
	}
}

// TestWriteAligned: a span crossing page boundaries is written as its
// head up to the first boundary and the rest from there, every byte once;
// a span starting on a boundary, or within one page, is one write.
func TestWriteAligned(t *testing.T) {
	const base = 0x10000
	for _, c := range []struct {
		start  uint64
		n      int
		writes [][2]uint64 // [addr, len]
	}{
		{base + 100, 10000, [][2]uint64{{base + 100, pageSize - 100}, {base + pageSize, 10000 - (pageSize - 100)}}},
		{base + pageSize, 10000, [][2]uint64{{base + pageSize, 10000}}},
		{base + 100, 200, [][2]uint64{{base + 100, 200}}},
		{base + pageSize - 8, 8, [][2]uint64{{base + pageSize - 8, 8}}},
		{base + pageSize - 8, 9, [][2]uint64{{base + pageSize - 8, 8}, {base + pageSize, 1}}},
	} {
		m := &recordMem{fakeMem: fakeMem{base: base, b: make([]byte, 4*pageSize)}}
		b := make([]byte, c.n)
		for i := range b {
			b[i] = byte(i*7 + 1)
		}
		if err := writeAligned(m, c.start, b); err != nil {
			t.Fatal(err)
		}
		if len(m.writes) != len(c.writes) {
			t.Fatalf("start %#x, %d bytes: writes %v, want %v", c.start, c.n, m.writes, c.writes)
		}
		for i, w := range m.writes {
			if w != c.writes[i] {
				t.Fatalf("start %#x, %d bytes: writes %v, want %v", c.start, c.n, m.writes, c.writes)
			}
		}
		got := m.b[c.start-base : c.start-base+uint64(c.n)]
		for i := range b {
			if got[i] != b[i] {
				t.Fatalf("start %#x, %d bytes: byte %d is %#x, want %#x", c.start, c.n, i, got[i], b[i])
			}
		}
	}
}

type recordMem struct {
	fakeMem
	writes [][2]uint64
}

func (r *recordMem) WriteMem(addr uint64, b []byte) error {
	r.writes = append(r.writes, [2]uint64{addr, uint64(len(b))})
	return r.fakeMem.WriteMem(addr, b)
}
