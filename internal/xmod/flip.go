package xmod

import (
	"context"
	"fmt"

	"github.com/edgeprobe/edgeprobe/internal/ptrace"
)

// FlipOptions tune Flip.
type FlipOptions struct {
	// Coalesce writes each page's changed sites with one pwrite spanning
	// them, rewriting the bytes in between with the values just re-read.
	// Off by default: see docs/protocols.md for the measurement and for the
	// hazard (a concurrent writer of that page, such as a JIT in the target,
	// could have its bytes reverted).
	Coalesce bool
	// Pristine, when set, lets runs of sites in mappings it vouches for be
	// written with one checked and read-back pwrite each (flipSpans,
	// docs/protocols.md); everything else is written one byte per site.
	Pristine Pristine
	MaxSpan  uint64     // bytes per grouped read and span write; 0: DefaultMaxSpan
	Stats    *SpanStats // filled in when Pristine is set; may be nil
	// Scratch, if at least 3*(MaxSpan+16) bytes, holds a span's copies
	// (a session reuses one for every batch instead of allocating it).
	Scratch []byte
}

// Flip toggles sites whose two forms differ in exactly one byte by writing
// that byte alone: a one-byte store is atomic, so every core fetches either
// the old or the new instruction, never a mixture, and no thread needs to
// stop. Every site is read and checked first; if any holds neither form the
// batch is refused before a byte is written, with an error naming each such
// site and the bytes seen. A cancelled ctx stops the batch between sites;
// every site is then in one of its forms.
func Flip(ctx context.Context, m Mem, changes []Change, opts FlipOptions) (Result, error) {
	// A tracer: run the batch on its thread, one hand-off instead of one
	// per read and write.
	var res Result
	err := onThread(m, func(m Mem) error {
		var err error
		res, err = flip(ctx, m, changes, opts)
		return err
	})
	return res, err
}

// onThread runs fn with m, or, when m is a tracer, on the tracer's thread
// with the memory as that thread reaches it (ptrace.ThreadMem: its calls
// are the system calls, without the per-call check of the calling thread
// that the tracer's own ReadMem and WriteMem make).
func onThread(m Mem, fn func(m Mem) error) error {
	switch d := m.(type) {
	case interface {
		DoMem(func(*ptrace.ThreadMem) error) error
	}:
		return d.DoMem(func(tm *ptrace.ThreadMem) error { return fn(tm) })
	case interface{ Do(func() error) error }:
		return d.Do(func() error { return fn(m) })
	}
	return fn(m)
}

func flip(ctx context.Context, m Mem, changes []Change, opts FlipOptions) (Result, error) {
	var res Result
	cs, err := validate(changes)
	if err != nil {
		return res, err
	}
	at := make([]int, len(cs))
	for i, c := range cs {
		d := c.Site.Differing()
		if len(d) != 1 {
			return res, fmt.Errorf("%v: forms differ in %d bytes: %w", c.Site, len(d), ErrNotFlippable)
		}
		at[i] = d[0]
	}
	if opts.Pristine != nil {
		return flipSpans(ctx, m, cs, at, opts)
	}
	todo, _, unchanged, err := plan(m, cs)
	res.Unchanged = unchanged
	if err != nil {
		return res, err
	}
	if opts.Coalesce {
		return flipCoalesced(ctx, m, todo, res)
	}
	for _, c := range todo {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		i := c.Site.Differing()[0]
		if err := m.WriteMem(c.Site.Addr+uint64(i), c.Site.form(c.On)[i:i+1]); err != nil {
			return res, fmt.Errorf("%v: %w", c.Site, err)
		}
		res.Changed++
	}
	return res, nil
}

func flipCoalesced(ctx context.Context, m Mem, todo []Change, res Result) (Result, error) {
	for i := 0; i < len(todo); {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		// The run of sites whose changed bytes lie in one page.
		first := todo[i].Site.Addr + uint64(todo[i].Site.Differing()[0])
		j, last := i, first
		for j < len(todo) {
			b := todo[j].Site.Addr + uint64(todo[j].Site.Differing()[0])
			if b/pageSize != first/pageSize {
				break
			}
			last = b
			j++
		}
		if j == i+1 {
			c := todo[i]
			d := c.Site.Differing()[0]
			if err := m.WriteMem(first, c.Site.form(c.On)[d:d+1]); err != nil {
				return res, fmt.Errorf("%v: %w", c.Site, err)
			}
			res.Changed++
			i = j
			continue
		}
		// Re-read the span right before writing it back, and re-check every
		// site in it: only then are the bytes in between current.
		buf := make([]byte, last-first+1)
		if err := m.ReadMem(first, buf); err != nil {
			return res, err
		}
		for _, c := range todo[i:j] {
			d := c.Site.Differing()[0]
			off := c.Site.Addr + uint64(d) - first
			old := c.Site.form(!c.On)[d]
			if buf[off] != old {
				return res, fmt.Errorf("%v changed under us (byte %d is %#x, want %#x): %w", c.Site, d, buf[off], old, ErrUnexpectedBytes)
			}
			buf[off] = c.Site.form(c.On)[d]
		}
		if err := m.WriteMem(first, buf); err != nil {
			return res, err
		}
		res.Changed += j - i
		i = j
	}
	return res, nil
}
