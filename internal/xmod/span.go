package xmod

import (
	"bytes"
	"context"
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
	// differs.
	Check(addr uint64, cur []byte) error
}

// SpanStats says how a flip batch with a Pristine was written.
type SpanStats struct {
	Spans     int      // coalesced writes
	SpanSites int      // sites written by them
	OneByte   int      // sites written one byte at a time
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
	out := make([][]byte, len(sites))
	for i := 0; i < len(sites); {
		start := sites[i].Addr
		limit := start + maxSpan
		if extent != nil {
			if e, ok := extent(start); ok && e < limit {
				limit = e
			} else if !ok {
				limit = (start/pageSize + 1) * pageSize
			}
		}
		j, end := i+1, start+uint64(sites[i].Len())
		for j < len(sites) {
			e := sites[j].Addr + uint64(sites[j].Len())
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
				b := make([]byte, sites[k].Len())
				if err := m.ReadMem(sites[k].Addr, b); err != nil {
					return nil, err
				}
				out[k] = b
			}
			i = j
			continue
		}
		for k := i; k < j; k++ {
			off := sites[k].Addr - start
			out[k] = buf[off : off+uint64(sites[k].Len()) : off+uint64(sites[k].Len())]
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
	st := opts.Stats
	if st == nil {
		st = &SpanStats{}
	}
	maxSpan := opts.MaxSpan
	if maxSpan == 0 {
		maxSpan = DefaultMaxSpan
	}
	pr := opts.Pristine
	sites := make([]Site, len(cs))
	for i, c := range cs {
		sites[i] = c.Site
	}
	cur, err := readRuns(m, sites, maxSpan, pr.Extent)
	if err != nil {
		return res, err
	}
	var todo []Change
	var todoAt []int
	var bad []error
	for i, c := range cs {
		switch classify(c.Site, cur[i]) {
		case StateInvalid:
			bad = append(bad, &SiteError{Site: c.Site, Seen: append([]byte(nil), cur[i]...)})
		case StateActive:
			if c.On {
				res.Unchanged++
				continue
			}
			todo, todoAt = append(todo, c), append(todoAt, at[i])
		case StateInert:
			if !c.On {
				res.Unchanged++
				continue
			}
			todo, todoAt = append(todo, c), append(todoAt, at[i])
		}
	}
	if len(bad) > 0 {
		return res, errors.Join(bad...)
	}
	oneByte := func(c Change, d int) error {
		if err := m.WriteMem(c.Site.Addr+uint64(d), c.Site.form(c.On)[d:d+1]); err != nil {
			return fmt.Errorf("%v: %w", c.Site, err)
		}
		res.Changed++
		st.OneByte++
		return nil
	}
	raced := false
	for i := 0; i < len(todo); {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		start := todo[i].Site.Addr
		end, ok := pr.Extent(start)
		j := i + 1
		if ok && !raced {
			for j < len(todo) {
				e := todo[j].Site.Addr + uint64(todo[j].Site.Len())
				if e > end || e-start > maxSpan {
					break
				}
				j++
			}
		}
		if j == i+1 {
			if err := oneByte(todo[i], todoAt[i]); err != nil {
				return res, err
			}
			i = j
			continue
		}
		run, runAt := todo[i:j], todoAt[i:j]
		n, err := writeSpan(m, pr, run, runAt, st, oneByte)
		res.Changed += n
		if errors.Is(err, ErrRaced) {
			raced = true
			st.Raced = append(st.Raced, err.Error())
		} else if err != nil {
			return res, err
		}
		i = j
	}
	return res, nil
}

// writeSpan writes one run of sites (sorted, in one span-writable mapping)
// with one pwrite, after re-reading and checking the span; it returns the
// sites it wrote that way. Sites it leaves to oneByte are counted there.
func writeSpan(m Mem, pr Pristine, run []Change, at []int, st *SpanStats, oneByte func(Change, int) error) (int, error) {
	start := run[0].Site.Addr
	last := run[len(run)-1].Site
	buf := make([]byte, last.Addr+uint64(last.Len())-start)
	if err := m.ReadMem(start, buf); err != nil {
		return 0, err
	}
	fallback := func(why string) (int, error) {
		st.Fallbacks = append(st.Fallbacks, why)
		for k, c := range run {
			if err := oneByte(c, at[k]); err != nil {
				return 0, err
			}
		}
		return 0, nil
	}
	// The sites must still hold the forms the plan saw (nothing else of
	// ours writes them: the per-process lock), and the span must be the
	// file's bytes but at probe sites.
	for _, c := range run {
		off := c.Site.Addr - start
		if !bytes.Equal(buf[off:off+uint64(c.Site.Len())], c.Site.form(!c.On)) {
			return 0, fmt.Errorf("%v changed under us (holds % x): %w", c.Site, buf[off:off+uint64(c.Site.Len())], ErrUnexpectedBytes)
		}
	}
	if err := pr.Check(start, buf); err != nil {
		return fallback(err.Error())
	}
	want := append([]byte(nil), buf...)
	for k, c := range run {
		want[c.Site.Addr+uint64(at[k])-start] = c.Site.form(c.On)[at[k]]
	}
	if err := m.WriteMem(start, want); err != nil {
		return 0, err
	}
	got := make([]byte, len(want))
	if err := m.ReadMem(start, got); err != nil {
		return 0, err
	}
	st.Spans++
	if bytes.Equal(got, want) {
		st.SpanSites += len(run)
		return len(run), nil
	}
	// Something wrote the span between our read and the read-back. Each of
	// our sites now holds its new form (done), its old one (something undid
	// our byte: write it alone) or neither (not ours to fix: report).
	first := -1
	for k := range got {
		if got[k] != want[k] {
			first = k
			break
		}
	}
	n := 0
	var bad []error
	for k, c := range run {
		off := c.Site.Addr - start
		seen := got[off : off+uint64(c.Site.Len())]
		switch {
		case bytes.Equal(seen, c.Site.form(c.On)):
			n++
			st.SpanSites++
		case bytes.Equal(seen, c.Site.form(!c.On)):
			if err := oneByte(c, at[k]); err != nil {
				return n, err
			}
		default:
			bad = append(bad, &SiteError{Site: c.Site, Seen: append([]byte(nil), seen...)})
		}
	}
	if len(bad) > 0 {
		return n, errors.Join(bad...)
	}
	return n, fmt.Errorf("span %#x-%#x: byte at %#x read back %#02x, written %#02x: %w",
		start, start+uint64(len(want)), start+uint64(first), got[first], want[first], ErrRaced)
}
