package xmod

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
)

// DefaultMaxSpan bounds one grouped read and one coalesced write: long
// enough that a 40,000-site text is a few dozen system calls, short enough
// that the time between the check of a span and its write stays a few
// microseconds (docs/protocols.md, "Batches at page speed").
const DefaultMaxSpan = 64 << 10

// Pristine is what makes a coalesced write safe: it knows which mappings a
// span write may rewrite and what their bytes must be. A span write
// rewrites every byte between the sites it changes with the value just
// read; that is harmless (each byte holds one value throughout, each site
// changes in one byte) unless something else writes those bytes between
// our read and our write, whose change we would then undo. Only pages that
// nothing has ever modified but at probe sites qualify.
type Pristine interface {
	// Extent returns the end of the mapping that holds addr when that
	// mapping may be span-written (private, file-backed, r-x: never made
	// writable), and ok=false otherwise.
	Extent(addr uint64) (end uint64, ok bool)
	// Check returns nil when cur, the memory at [addr, addr+len(cur)),
	// equals the mapped file's bytes except inside known probe sites that
	// each hold one of their two forms; otherwise an error saying where it
	// differs. ours are the batch's sites in the span (sorted): the caller
	// has checked that each holds one of its forms.
	Check(addr uint64, cur []byte, ours []Extent) error
}

// PristineFile is a Pristine that can read the file's bytes of a span: a
// Prepared's span is then checked in one pass over its sites (buildFile),
// and Check is asked only about a span that differs from the file outside
// the batch's own sites.
type PristineFile interface {
	Pristine
	// File reads into b the mapped file's bytes for [addr, addr+len(b)),
	// or fails when that range does not lie in one mapping Extent allows.
	File(addr uint64, b []byte) error
}

// Extent is a site's place: what Pristine.Check needs of the batch's own
// sites (no pointers, so a 40,000-site batch copies no heap references).
type Extent struct {
	Addr uint64
	Len  int
}

// SpanStats says how a flip batch with a Pristine was written.
type SpanStats struct {
	Spans     int // coalesced writes
	SpanSites int // sites written by them
	OneByte   int // sites written one byte at a time
	// Imaged counts the spans written from their image (D61: the re-read
	// equalled the span as checked before its last write).
	Imaged    int
	Fallbacks []string // why a run of sites was written one byte at a time
	// Raced lists spans whose read-back after the write differed from what
	// was written: something in the target wrote the same page meanwhile.
	// The rest of the batch is then written one byte at a time.
	Raced []string
}

// ErrRaced wraps the note about a span that changed while it was written.
var ErrRaced = errors.New("a span changed while it was written")

// readRuns reads the current bytes of every site (sorted by address): one
// read per run of sites spanning at most maxSpan bytes and one mapping
// (sites of different mappings are never in one read; a run that fails is
// read again site by site, so a gap between mappings costs only time).
func readRuns(m Mem, sites []Site, maxSpan uint64, extent func(uint64) (uint64, bool)) ([][]byte, error) {
	return readRunsOf(m, len(sites), func(i int) *Site { return &sites[i] }, maxSpan, extent)
}

func readRunsOf(m Mem, n int, site func(int) *Site, maxSpan uint64, extent func(uint64) (uint64, bool)) ([][]byte, error) {
	out := make([][]byte, n)
	for i := 0; i < n; {
		start := site(i).Addr
		limit := start + maxSpan
		if extent != nil {
			if e, ok := extent(start); ok && e < limit {
				limit = e
			} else if !ok {
				limit = (start/pageSize + 1) * pageSize
			}
		}
		j, end := i+1, start+uint64(site(i).Len())
		for j < n {
			e := site(j).Addr + uint64(site(j).Len())
			if e > limit {
				break
			}
			end = e
			j++
		}
		buf := make([]byte, end-start)
		if err := m.ReadMem(start, buf); err != nil {
			if j == i+1 {
				return nil, err
			}
			// A run across a gap: read each site alone.
			for k := i; k < j; k++ {
				b := make([]byte, site(k).Len())
				if err := m.ReadMem(site(k).Addr, b); err != nil {
					return nil, err
				}
				out[k] = b
			}
			i = j
			continue
		}
		for k := i; k < j; k++ {
			s := site(k)
			off := s.Addr - start
			out[k] = buf[off : off+uint64(s.Len()) : off+uint64(s.Len())]
		}
		i = j
	}
	return out, nil
}

// ClassifyRuns is Classify with the reads grouped: one read per run of
// sites within maxSpan bytes (DefaultMaxSpan if 0), whatever their order.
func ClassifyRuns(m Mem, sites []Site, maxSpan uint64) ([]State, error) {
	if maxSpan == 0 {
		maxSpan = DefaultMaxSpan
	}
	order := make([]int, len(sites))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return sites[order[a]].Addr < sites[order[b]].Addr })
	sorted := make([]Site, len(sites))
	for k, i := range order {
		sorted[k] = sites[i]
	}
	cur, err := readRuns(m, sorted, maxSpan, nil)
	if err != nil {
		return nil, err
	}
	out := make([]State, len(sites))
	for k, i := range order {
		out[i] = classify(sites[i], cur[k])
	}
	return out, nil
}

// flipSpans is Flip with a Pristine: every site is read (grouped) and
// checked first, all or nothing, as in Flip; then each run of sites to
// change within one span-writable mapping and maxSpan bytes is re-read,
// checked against the file (Pristine.Check), written with one pwrite and
// read back. A run that fails the check is written one byte per site; a
// read-back that differs from what was written means a writer shares the
// page: the run's sites are finished one byte at a time and so is the rest
// of the batch.
func flipSpans(ctx context.Context, m Mem, cs []Change, at []int, opts FlipOptions) (Result, error) {
	var res Result
	maxSpan := opts.MaxSpan
	if maxSpan == 0 {
		maxSpan = DefaultMaxSpan
	}
	cur, err := readRunsOf(m, len(cs), func(i int) *Site { return &cs[i].Site }, maxSpan, opts.Pristine.Extent)
	if err != nil {
		return res, err
	}
	todo := make([]int, 0, len(cs)) // indices into cs
	var bad []error
	for i, c := range cs {
		switch classify(c.Site, cur[i]) {
		case StateActive:
			if c.On {
				res.Unchanged++
				continue
			}
			todo = append(todo, i)
		case StateInert:
			if !c.On {
				res.Unchanged++
				continue
			}
			todo = append(todo, i)
		default: // neither form, or torn (an int3 left mid-patch): refuse the batch
			bad = append(bad, &SiteError{Site: c.Site, Seen: append([]byte(nil), cur[i]...)})
		}
	}
	if len(bad) > 0 {
		return res, errors.Join(bad...)
	}
	return writeSpans(ctx, m, cs, at, todo, opts, res, nil)
}

// writeSpans writes the sites todo (indices into cs, sorted; each known to
// hold the form it is leaving) as flipSpans does, adding to res. p, if not
// nil, is the Prepared whose batch this is: its words stand for the
// changes, it gets which sites a clean read-back confirmed, and it keeps a
// span's scratch of sites and (when kept) its images between calls.
func writeSpans(ctx context.Context, m Mem, cs []Change, at []int, todo []int, opts FlipOptions, res Result, p *Prepared) (Result, error) {
	w := &spanWriter{m: m, pr: opts.Pristine, st: opts.Stats, cs: cs, at: at}
	var word []siteWord
	if p != nil {
		word, w.word, w.confirmed, w.ours = p.word, p.word, p.confirmed, p.ours
		w.img = p.spanImages(opts.Pristine)
		defer func() { p.ours, p.nconfirmed = w.ours, p.nconfirmed+w.nconfirmed }()
	}
	if w.st == nil {
		w.st = &SpanStats{}
	}
	maxSpan := opts.MaxSpan
	if maxSpan == 0 {
		maxSpan = DefaultMaxSpan
	}
	if need := int(3 * (maxSpan + 16)); len(opts.Scratch) >= need {
		w.buf = opts.Scratch[:need]
	} else {
		w.buf = make([]byte, need)
	}
	raced := false
	for i := 0; i < len(todo); {
		if err := ctx.Err(); err != nil {
			res.Changed = w.changed
			return res, err
		}
		start := cs[todo[i]].Site.Addr
		end, ok := w.pr.Extent(start)
		j := i + 1
		if ok && !raced {
			// The run: every following site that ends within the mapping
			// and maxSpan of start. Sites are sorted and disjoint, so their
			// ends rise and bisection finds it without a pass over them.
			j += sort.Search(len(todo)-j, func(x int) bool {
				var e uint64
				if word != nil {
					ww := &word[todo[j+x]]
					e = ww.addr + uint64(ww.len)
				} else {
					s := &cs[todo[j+x]].Site
					e = s.Addr + uint64(s.Len())
				}
				return e > end || e-start > maxSpan
			})
		}
		if j == i+1 {
			if err := w.oneByte(todo[i]); err != nil {
				res.Changed = w.changed
				return res, err
			}
			i = j
			continue
		}
		err := w.span(todo[i:j])
		if errors.Is(err, ErrRaced) {
			raced = true
			w.st.Raced = append(w.st.Raced, err.Error())
		} else if err != nil {
			res.Changed = w.changed
			return res, err
		}
		i = j
	}
	res.Changed = w.changed
	return res, nil
}

// spanWriter writes the runs of one flipSpans batch.
type spanWriter struct {
	m    Mem
	pr   Pristine
	st   *SpanStats
	cs   []Change
	at   []int      // each change's differing byte
	word []siteWord // each change's forms as words (Prepared), or nil
	ours []Extent   // scratch: a span's sites
	// confirmed marks the sites a clean read-back showed in their new
	// form (Prepared.ClassifyAfterFlip), or is nil.
	confirmed  []bool
	nconfirmed int    // how many sites this batch marked in confirmed
	buf        []byte // scratch: the span read, written and read back
	changed    int
	// img: the images of spans checked and written before, or nil
	// (spanImages; only a Prepared keeps them).
	img *spanImages
}

func (w *spanWriter) oneByte(i int) error {
	c, d := w.cs[i], w.at[i]
	if err := w.m.WriteMem(c.Site.Addr+uint64(d), c.Site.form(c.On)[d:d+1]); err != nil {
		return fmt.Errorf("%v: %w", c.Site, err)
	}
	w.changed++
	w.st.OneByte++
	return nil
}

// writeAligned writes a span as two pwrites when it crosses a page
// boundary: the bytes up to its first boundary, then the rest.
// /proc/PID/mem copies a write 4 KiB at a time from where the write
// starts, and each such piece that straddles two of the target's pages
// costs two page look-ups, pins and dirty marks instead of one; from a
// boundary on, each piece is one page (a quarter less CPU for a 64 KiB
// span: D74). Every byte is still written once, in address order, and
// holds its old or its new value at every instant (the kernel copies a
// write in pieces anyway); the span's read-back follows the last piece.
func writeAligned(m Mem, start uint64, b []byte) error {
	head := int(pageSize - start%pageSize)
	if head == pageSize || head >= len(b) {
		return m.WriteMem(start, b)
	}
	if err := m.WriteMem(start, b[:head]); err != nil {
		return err
	}
	return m.WriteMem(start+uint64(head), b[head:])
}

// span writes one run of sites (indices into cs, sorted, in one
// span-writable mapping) with one pwrite (two when it crosses a page
// boundary: writeAligned), after re-reading and checking the span, and
// reads it back.
func (w *spanWriter) span(run []int) error {
	first, last := w.cs[run[0]].Site, w.cs[run[len(run)-1]].Site
	start := first.Addr
	n := int(last.Addr + uint64(last.Len()) - start)
	cur, want, got := w.buf[:n], w.buf[n:2*n], w.buf[2*n:3*n]
	if err := w.m.ReadMem(start, cur); err != nil {
		return err
	}
	// A span that reads back exactly as it was checked before its last
	// write passes the same checks and is written as it was then
	// (spanImages, D61).
	keep := w.img != nil && contiguous(run)
	var im *spanImage
	if keep {
		im = w.img.lookup(run[0], run[len(run)-1], start, n)
	}
	if im != nil && bytes.Equal(cur, im.old) {
		want = im.new
		w.st.Imaged++
	} else {
		im = nil
		if done, err := w.build(run, start, cur, want, got); done || err != nil {
			return err
		}
	}
	if err := writeAligned(w.m, start, want); err != nil {
		return err
	}
	if err := w.m.ReadMem(start, got); err != nil {
		return err
	}
	w.st.Spans++
	if bytes.Equal(got, want) {
		w.st.SpanSites += len(run)
		w.changed += len(run)
		if w.confirmed != nil {
			for _, i := range run {
				w.confirmed[i] = true
			}
			w.nconfirmed += len(run)
		}
		if keep && im == nil {
			w.img.keep(run[0], run[len(run)-1], start, cur, want)
		}
		return nil
	}
	if keep {
		w.img.drop(run[0])
	}
	return w.raced(run, start, got, want)
}

// build checks a span just read (cur) and makes what to write (want): each
// site must hold the form it is leaving (what the batch's read saw) and the
// span must be the file's bytes but at probe sites (Pristine.Check). done
// is true when the check failed and the run was written one byte per site
// instead.
func (w *spanWriter) build(run []int, start uint64, cur, want, scratch []byte) (done bool, err error) {
	// Nothing else of ours writes the sites (the per-process lock).
	if pf, ok := w.pr.(PristineFile); ok && w.word != nil {
		return w.buildFile(pf, run, start, cur, want, scratch)
	}
	return w.buildCheck(run, start, cur, want)
}

// buildCheck is build through Pristine.Check, which is given the sites.
func (w *spanWriter) buildCheck(run []int, start uint64, cur, want []byte) (done bool, err error) {
	if cap(w.ours) < len(run) {
		w.ours = make([]Extent, len(run))
	}
	ours := w.ours[:len(run)]
	// One pass over the run: each site must hold the form it is leaving
	// (what the batch's read saw), and what we write is the span as just
	// read with each site's differing byte set to its new form.
	copy(want, cur)
	for k, i := range run {
		d := w.at[i]
		if w.word != nil {
			// Prepared's words: one load and compare per site, without
			// touching the Change (the batch's sites stay in cache).
			ww := &w.word[i]
			ours[k] = Extent{ww.addr, int(ww.len)}
			if off := ww.addr - start; ww.short && off+8 <= uint64(len(cur)) {
				old, form := ww.inert, ww.active
				if !ww.on {
					old, form = ww.active, ww.inert
				}
				if binary.LittleEndian.Uint64(cur[off:])&ww.mask() == old {
					want[off+uint64(d)] = byte(form >> (8 * uint(d)))
					continue
				}
			}
		}
		s, on := &w.cs[i].Site, w.cs[i].On
		ours[k] = Extent{s.Addr, s.Len()}
		off := s.Addr - start
		if seen := cur[off : off+uint64(s.Len())]; !bytes.Equal(seen, s.form(!on)) {
			return false, fmt.Errorf("%v changed under us (holds % x): %w", s, seen, ErrUnexpectedBytes)
		}
		want[off+uint64(d)] = s.form(on)[d]
	}
	if err := w.pr.Check(start, cur, ours); err != nil {
		return w.fallback(run, err)
	}
	return false, nil
}

// buildFile is build for a Prepared's words and a PristineFile, in one pass
// over the sites: each site's old form is checked, its new byte set in
// want and its bytes laid over the file's (read into file), so that the
// span passes when it then equals the file's bytes whole (one memequal);
// only when it does not is Check asked, whether other probe sites explain
// the difference. The same check as buildCheck's, without a second pass
// over the sites.
func (w *spanWriter) buildFile(pf PristineFile, run []int, start uint64, cur, want, file []byte) (done bool, err error) {
	file = file[:len(cur)]
	if err := pf.File(start, file); err != nil {
		return w.fallback(run, err)
	}
	copy(want, cur)
	n := uint64(len(cur))
	want, file = want[:n], file[:n]
	word := w.word
	for _, i := range run {
		ww := &word[i]
		d := uint64(ww.at)
		off := ww.addr - start
		if ww.short && off+8 <= n {
			old, form := ww.inert, ww.active
			if !ww.on {
				old, form = ww.active, ww.inert
			}
			mask := ww.mask()
			c := binary.LittleEndian.Uint64(cur[off : off+8 : off+8])
			if c&mask == old && d < 8 {
				want[off+d] = byte(form >> (8 * d))
				fb := file[off : off+8 : off+8]
				binary.LittleEndian.PutUint64(fb, binary.LittleEndian.Uint64(fb)&^mask|c&mask)
				continue
			}
		}
		s, on := &w.cs[i].Site, w.cs[i].On
		seen := cur[off : off+uint64(s.Len())]
		if !bytes.Equal(seen, s.form(!on)) {
			return false, fmt.Errorf("%v changed under us (holds % x): %w", s, seen, ErrUnexpectedBytes)
		}
		want[off+d] = s.form(on)[d]
		copy(file[off:off+uint64(s.Len())], seen)
	}
	if bytes.Equal(cur, file) {
		return false, nil
	}
	// Something outside the batch's sites differs from the file: Check
	// says whether other probe sites explain it.
	if cap(w.ours) < len(run) {
		w.ours = make([]Extent, len(run))
	}
	ours := w.ours[:len(run)]
	for k, i := range run {
		ours[k] = Extent{w.word[i].addr, int(w.word[i].len)}
	}
	if err := w.pr.Check(start, cur, ours); err != nil {
		return w.fallback(run, err)
	}
	return false, nil
}

// fallback writes a run that failed its check one byte per site, noting
// why.
func (w *spanWriter) fallback(run []int, why error) (done bool, err error) {
	w.st.Fallbacks = append(w.st.Fallbacks, why.Error())
	for _, i := range run {
		if err := w.oneByte(i); err != nil {
			return true, err
		}
	}
	return true, nil
}

// raced finishes a span whose read-back (got) differs from what was
// written (want).
func (w *spanWriter) raced(run []int, start uint64, got, want []byte) error {
	n := len(want)
	// Something wrote the span between our read and the read-back. Each of
	// our sites now holds its new form (done), its old one (something undid
	// our byte: write it alone) or neither (not ours to fix: report).
	diff := 0
	for got[diff] == want[diff] {
		diff++
	}
	var bad []error
	for _, i := range run {
		s, on := w.cs[i].Site, w.cs[i].On
		off := s.Addr - start
		seen := got[off : off+uint64(s.Len())]
		switch {
		case bytes.Equal(seen, s.form(on)):
			w.changed++
			w.st.SpanSites++
		case bytes.Equal(seen, s.form(!on)):
			if err := w.oneByte(i); err != nil {
				return err
			}
		default:
			bad = append(bad, &SiteError{Site: s, Seen: append([]byte(nil), seen...)})
		}
	}
	if len(bad) > 0 {
		return errors.Join(bad...)
	}
	return fmt.Errorf("span %#x-%#x: byte at %#x read back %#02x, written %#02x: %w",
		start, start+uint64(n), start+uint64(diff), got[diff], want[diff], ErrRaced)
}
