package xmod

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
)

// Prepared is a batch of changes checked once (each site's forms valid, no
// two sites overlapping), sorted by address, with each site's differing
// byte found: what a caller that applies the same changes again and again
// (a hotpatch session toggling one selection) would otherwise redo on every
// call. Its scratch buffers are reused, so a Prepared is for one goroutine
// at a time.
type Prepared struct {
	cs  []Change // sorted by address
	pos []int    // pos[k]: the caller's index of cs[k]
	at  []int    // cs[k]'s differing byte; -1 when its forms differ in more than one
	// word[k]: cs[k]'s address, length, caller's index, differing byte
	// and forms as little-endian words (for sites of at most 8 bytes):
	// Classify walks this compact array and compares one load with two
	// words instead of calling bytes.Equal.
	word []siteWord
	buf  []byte // one run's read
	// Scratch of Flip: the sites to write.
	todo []int
	// confirmed[k]: the last Flip wrote cs[k] in a span whose read-back
	// matched (ClassifyAfterFlip); confirmedOK: that Flip succeeded.
	confirmed   []bool
	confirmedOK bool
	// nconfirmed: how many of confirmed are true.
	nconfirmed int
	// asked[i]: the state change i asks for (caller's order), on first need.
	asked []State
	// flippable: every site's forms differ in exactly one byte.
	flippable bool
	// leave[i]: the state change i (caller's order) leaves, the opposite
	// of the one it asks for; all: 0..len(cs)-1 (every).
	leave []State
	all   []int
	// ours: scratch of a span's sites (spanWriter), kept between Flips.
	ours []Extent
	// What KeepImages keeps (D61), from the second use on (a selection
	// applied once, as by one hotpatch call, makes none): images, the
	// spans as checked and as written by the last Flips; memo, the last
	// grouped read of Classify and its states.
	keep       bool // KeepImages
	images     *spanImages
	spanFlips  int
	memo       *classifyMemo
	classifies int
	imageBytes int // in images and memo
}

// siteWord is 32 bytes: a 40,000-site batch walks 1.3 MB of them per
// pass over its sites, whose loads (not the compares) are what such a
// pass costs.
type siteWord struct {
	addr          uint64
	active, inert uint64 // the forms, when short
	pos           int32  // the caller's index
	len           uint8
	at            uint8 // the differing byte, when the forms differ in one
	on            bool  // the form the change asks for
	short         bool  // len <= 8: active and inert hold the forms
}

// mask covers a short site's bytes in a little-endian word.
func (w *siteWord) mask() uint64 { return ^uint64(0) >> (64 - 8*uint(w.len)) }

func wordOf(b []byte) uint64 {
	var v uint64
	for i := len(b) - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

// Prepare checks changes as every protocol does and returns them prepared.
func Prepare(changes []Change) (*Prepared, error) {
	p := &Prepared{cs: make([]Change, len(changes)), pos: make([]int, len(changes)), at: make([]int, len(changes)), word: make([]siteWord, len(changes))}
	for i := range p.pos {
		p.pos[i] = i
	}
	// A selection usually comes in address order (a list's order): then
	// the sort is a check.
	sorted := true
	for i := 1; i < len(changes); i++ {
		if changes[i].Site.Addr < changes[i-1].Site.Addr {
			sorted = false
			break
		}
	}
	if !sorted {
		sort.SliceStable(p.pos, func(a, b int) bool { return changes[p.pos[a]].Site.Addr < changes[p.pos[b]].Site.Addr })
	}
	for k, i := range p.pos {
		p.cs[k] = changes[i]
	}
	for k := range p.cs {
		s := &p.cs[k].Site
		if err := s.check(); err != nil {
			return nil, err
		}
		if k > 0 {
			q := &p.cs[k-1].Site
			if q.Addr+uint64(q.Len()) > s.Addr {
				return nil, fmt.Errorf("%v overlaps %v: %w", *s, *q, ErrInvalidSite)
			}
		}
		p.at[k] = -1
		n := 0
		for j := range s.Active {
			if s.Active[j] != s.Inert[j] {
				p.at[k] = j
				n++
			}
		}
		if n != 1 {
			p.at[k] = -1
		}
		p.word[k] = siteWord{addr: s.Addr, pos: int32(p.pos[k]), len: uint8(s.Len()), on: p.cs[k].On}
		if p.at[k] >= 0 {
			p.word[k].at = uint8(p.at[k])
		}
		if l := s.Len(); l <= 8 {
			w := &p.word[k]
			w.active, w.inert, w.short = wordOf(s.Active), wordOf(s.Inert), true
		}
	}
	p.leave, p.all = make([]State, len(p.cs)), make([]int, len(p.cs))
	for k := range p.cs {
		p.leave[p.pos[k]] = stateOf(!p.cs[k].On)
		p.all[k] = k
	}
	p.flippable = true
	for _, d := range p.at {
		if d < 0 {
			p.flippable = false
		}
	}
	return p, nil
}

// Len is the number of changes.
func (p *Prepared) Len() int { return len(p.cs) }

// Flippable reports whether every site's forms differ in exactly one byte.
func (p *Prepared) Flippable() bool { return p.flippable }

// MaxRead bounds one of Prepared's grouped reads: it writes nothing, so no
// window bounds it, only the buffer a selection keeps (from 16 KiB a read
// is a process_vm_readv, whose cost per page falls with the read's size:
// D51).
const MaxRead = 256 << 10

// Classify reads every site, one read per run of sites within MaxRead
// bytes (as ClassifyRuns, whose runs are DefaultMaxSpan), and returns each site's state in
// the order of the changes given to Prepare, in out's storage when it is
// long enough.
func (p *Prepared) Classify(m Mem, out []State) ([]State, error) {
	if p.keep {
		if p.classifies++; p.classifies > 1 {
			if st, ok, err := p.classifyMemo(m, out); ok || err != nil {
				return st, err
			}
		}
	}
	return p.classify(m, out, nil)
}

// ClassifyAfterFlip is Classify after a Flip that returned no error: a
// site that Flip wrote as part of a span whose read-back, right after the
// write, equalled what was written is known to hold its asked form as of
// that read-back and is not read again; every other site is read. After a
// Flip that failed, or none, it is Classify.
func (p *Prepared) ClassifyAfterFlip(m Mem, out []State) ([]State, error) {
	if !p.confirmedOK {
		return p.classify(m, out, nil)
	}
	if p.nconfirmed == len(p.cs) {
		// Every site confirmed: each is in its asked form.
		if p.asked == nil {
			p.asked = make([]State, len(p.cs))
			for k := range p.word {
				p.asked[p.word[k].pos] = stateOf(p.word[k].on)
			}
		}
		if cap(out) < len(p.cs) {
			out = make([]State, len(p.cs))
		}
		out = out[:len(p.cs)]
		copy(out, p.asked)
		return out, nil
	}
	return p.classify(m, out, p.confirmed)
}

func (p *Prepared) classify(m Mem, out []State, skip []bool) ([]State, error) {
	if cap(out) >= len(p.cs) {
		out = out[:len(p.cs)]
	} else {
		out = make([]State, len(p.cs))
	}
	if p.buf == nil && len(p.cs) > 0 {
		// No run is longer than the sites' extent or MaxRead: a session
		// keeps thousands of small selections prepared.
		last := &p.cs[len(p.cs)-1].Site
		ext := last.Addr + uint64(last.Len()) - p.cs[0].Site.Addr
		p.buf = make([]byte, min(ext, MaxRead)+16)
	}
	skipped := func(k int) bool { return skip != nil && skip[k] }
	var one [16]byte
	ws := p.word
	for i := 0; i < len(ws); {
		if skipped(i) {
			out[ws[i].pos] = stateOf(ws[i].on)
			i++
			continue
		}
		// A run from site i to the last site to read within the limit; the
		// skipped sites inside it are read along but not classified. The
		// sites are sorted and disjoint, so their ends rise: the run's end
		// is found by bisection, not by a pass over the sites (a 40,000-
		// site batch is 2 MB of siteWords, and the pass cost more than the
		// classification).
		start := ws[i].addr
		limit := start + MaxRead
		n := sort.Search(len(ws)-i, func(x int) bool {
			w := &ws[i+x]
			return w.addr+uint64(w.len) > limit
		})
		j := i + max(n, 1)
		for j > i+1 && skipped(j-1) {
			j--
		}
		end := ws[j-1].addr + uint64(ws[j-1].len)
		buf := p.buf[:end-start]
		if err := m.ReadMem(start, buf); err != nil {
			if j == i+1 {
				return nil, err
			}
			// A run across a gap (two mappings): each site alone.
			for k := i; k < j; k++ {
				if skipped(k) {
					out[ws[k].pos] = stateOf(ws[k].on)
					continue
				}
				s := &p.cs[k].Site
				b := one[:s.Len()]
				if err := m.ReadMem(s.Addr, b); err != nil {
					return nil, err
				}
				out[p.pos[k]] = classify(*s, b)
			}
			i = j
			continue
		}
		if skip == nil {
			p.classifyRun(ws[i:j], i, buf, start, out)
		} else {
			for k := i; k < j; k++ {
				w := &ws[k]
				if skipped(k) {
					out[w.pos] = stateOf(w.on)
					continue
				}
				out[w.pos] = p.classifyAt(k, buf, w.addr-start)
			}
		}
		i = j
	}
	return out, nil
}

// classifyRun sets the state of sites ws (p.word[first:...]), which buf
// holds from start, in out: classifyAt for each, its common case inline
// (a pass over 40,000 sites is otherwise mostly calls and bounds checks).
func (p *Prepared) classifyRun(ws []siteWord, first int, buf []byte, start uint64, out []State) {
	n := uint64(len(buf))
	for x := range ws {
		w := &ws[x]
		off := w.addr - start
		if w.short && off+8 <= n {
			v := binary.LittleEndian.Uint64(buf[off:off+8:off+8]) & w.mask()
			if v == w.active {
				out[w.pos] = StateActive
				continue
			}
			if v == w.inert {
				out[w.pos] = StateInert
				continue
			}
		}
		out[w.pos] = p.classifyAt(first+x, buf, off)
	}
}

// classifyAt is the state of site k, which buf holds at off.
func (p *Prepared) classifyAt(k int, buf []byte, off uint64) State {
	w := &p.word[k]
	if w.short && off+8 <= uint64(len(buf)) {
		switch v := binary.LittleEndian.Uint64(buf[off:]) & w.mask(); v {
		case w.active:
			return StateActive
		case w.inert:
			return StateInert
		}
	}
	return classify(p.cs[k].Site, buf[off:off+uint64(w.len)])
}

func stateOf(on bool) State {
	if on {
		return StateActive
	}
	return StateInert
}

// every reports whether every state (caller's order) is the one its
// change leaves: one pass over a byte per site.
func (p *Prepared) every(states []State) bool {
	return SameStates(states, p.leave)
}

// ErrNotClassified means Prepared.Flip was given a state other than active
// or inert: the caller must refuse (or repair) such sites before writing.
var ErrNotClassified = errors.New("site is in neither form")

// Flip is Flip for the prepared changes, given each site's state as the
// caller's Classify just found it, under the caller's lock: the batch is
// not read a second time before it is written. Every state must be
// StateActive or StateInert (all or nothing, as Flip's own read: nothing is
// written otherwise), and every site flippable. Sites already in their
// asked form are not written. With opts.Pristine, runs are written as
// checked spans, each re-read and checked right before its write and read
// back (flipSpans); otherwise one byte per site. Coalesce is not offered.
// A tracer runs the batch on its thread, as Flip.
func (p *Prepared) Flip(ctx context.Context, m Mem, states []State, opts FlipOptions) (Result, error) {
	p.confirmedOK = false
	if len(states) != len(p.cs) {
		return Result{}, fmt.Errorf("%d states for %d prepared changes", len(states), len(p.cs))
	}
	if opts.Coalesce {
		return Result{}, errors.New("Prepared.Flip: Coalesce is not offered")
	}
	if !p.flippable {
		for k := range p.cs {
			if p.at[k] < 0 {
				return Result{}, fmt.Errorf("%v: %w", p.cs[k].Site, ErrNotFlippable)
			}
		}
	}
	// Every state classified, all or nothing (states is in the caller's
	// order: one pass over it, the site named only on failure).
	for i, st := range states {
		if st != StateActive && st != StateInert {
			for k := range p.pos {
				if p.pos[k] == i {
					return Result{}, fmt.Errorf("%v is %v: %w (nothing was written)", p.cs[k].Site, st, ErrNotClassified)
				}
			}
		}
	}
	var res Result
	err := onThread(m, func(m Mem) error {
		var err error
		res, err = p.flip(ctx, m, states, opts)
		return err
	})
	return res, err
}

func (p *Prepared) flip(ctx context.Context, m Mem, states []State, opts FlipOptions) (res Result, err error) {
	p.confirmedOK = false
	if p.confirmed == nil {
		p.confirmed = make([]bool, len(p.cs))
	} else {
		clear(p.confirmed)
	}
	p.nconfirmed = 0
	defer func() { p.confirmedOK = err == nil }()
	var todo []int
	if p.every(states) {
		// Every site leaves its state: all of them, in order (the usual
		// batch of a session toggling a selection back and forth). p.all
		// is only read.
		todo = p.all
	} else {
		todo = p.todo[:0]
		for k := range p.word {
			if w := &p.word[k]; (states[w.pos] == StateActive) == w.on {
				res.Unchanged++
				continue
			}
			todo = append(todo, k)
		}
		p.todo = todo[:0]
	}
	if opts.Pristine != nil {
		return writeSpans(ctx, m, p.cs, p.at, todo, opts, res, p)
	}
	for _, k := range todo {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		c, d := &p.cs[k], p.at[k]
		if err := m.WriteMem(c.Site.Addr+uint64(d), c.Site.form(c.On)[d:d+1]); err != nil {
			return res, fmt.Errorf("%v: %w", c.Site, err)
		}
		res.Changed++
	}
	return res, nil
}
