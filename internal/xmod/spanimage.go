package xmod

import (
	"bytes"
	"sort"
)

// PristineIdentity is a Pristine that can name what it vouches for (which
// mappings, of which files, where). A Prepared keeps the images of its
// checked spans (spanImages) only for a Pristine of this kind, and only
// while the identity stays the same: a different mapping at the same
// addresses, or a mapping that changed, starts them over.
type PristineIdentity interface {
	Pristine
	Identity() string
}

// spanImages are, for one Prepared, each span as it was last checked
// before its write and as it was written and read back (D61). A Prepared
// asks for one direction per site, so its spans always leave the same
// forms for the same forms: when a span re-read right before its write
// equals the image checked last time byte for byte, it passes the same
// checks (each site in the form it leaves, the rest the file's bytes or
// other probe sites in one of their forms: Pristine.Check is a function of
// those bytes, the file's and the list's), and what to write is the image
// written last time. Nothing is skipped but recomputing a known answer:
// the re-read, the write and the read-back are the same, right before and
// after the write.
type spanImages struct {
	identity string
	runs     map[int]*spanImage // by the index (into cs) of the span's first site
	bytes    int                // held in old and new
	owner    *Prepared          // whose imageBytes counts bytes
}

type spanImage struct {
	start    uint64
	last     int    // index of the span's last site; the span holds every site from first to last
	old, new []byte // the span as checked, and as written (its read-back equalled it)
}

// lookup returns the image of the span of sites first..last (every site
// between them) at start, n bytes long, or nil.
func (si *spanImages) lookup(first, last int, start uint64, n int) *spanImage {
	if si == nil {
		return nil
	}
	im := si.runs[first]
	if im == nil || im.last != last || im.start != start || len(im.old) != n {
		return nil
	}
	return im
}

// keep records the span of sites first..last at start as checked (old) and
// as written and read back (new).
func (si *spanImages) keep(first, last int, start uint64, old, new []byte) {
	if si.runs == nil {
		si.runs = map[int]*spanImage{}
	}
	im := si.runs[first]
	if im == nil || len(im.old) != len(old) {
		if im != nil {
			si.add(-2 * len(im.old))
		}
		im = &spanImage{old: make([]byte, len(old)), new: make([]byte, len(new))}
		si.runs[first] = im
		si.add(2 * len(old))
	}
	im.start, im.last = start, last
	copy(im.old, old)
	copy(im.new, new)
}

// drop forgets the span starting at site first (its write raced).
func (si *spanImages) drop(first int) {
	if im := si.runs[first]; im != nil {
		si.add(-2 * len(im.old))
		delete(si.runs, first)
	}
}

func (si *spanImages) add(n int) {
	si.bytes += n
	if si.owner != nil {
		si.owner.imageBytes += n
	}
}

// contiguous reports whether run (sorted indices) holds every index from
// its first to its last: only such a span is identified by its ends.
func contiguous(run []int) bool {
	return run[len(run)-1]-run[0] == len(run)-1
}

// KeepImages lets the Prepared keep, from its second use on, what it read
// and checked before (D61): the images of its checked spans (for a
// PristineIdentity) and its last grouped read with the states found in it
// (Classify). Off by default: it costs two copies of the text the
// selection covers, which its owner bounds (ImageBytes, DropImages).
func (p *Prepared) KeepImages(on bool) {
	p.keep = on
	if !on {
		p.DropImages()
	}
}

// spanImages returns the span images for a flip with pr, or nil when none
// are kept: not asked for, pr without identity, or the first such flip.
func (p *Prepared) spanImages(pr Pristine) *spanImages {
	id, ok := pr.(PristineIdentity)
	if !p.keep || !ok {
		return nil
	}
	p.spanFlips++
	if p.spanFlips == 1 {
		return nil
	}
	if key := id.Identity(); p.images == nil || p.images.identity != key {
		if p.images != nil {
			p.imageBytes -= p.images.bytes
		}
		p.images = &spanImages{identity: key, owner: p}
	}
	return p.images
}

// ImageBytes is the memory the Prepared holds in span images.
func (p *Prepared) ImageBytes() int { return p.imageBytes }

// DropImages forgets the images (a session bounding its memory): the next
// use is as the first (it keeps none), the one after it keeps them again.
func (p *Prepared) DropImages() {
	p.images, p.memo, p.imageBytes = nil, nil, 0
	p.classifies, p.spanFlips = 0, 0
}

// classifyMemo is a Prepared's last grouped read of every site and the
// states it found (D61): a read that equals it byte for byte has the same
// states, so they are copied instead of found again, site by site. The
// read itself is made every time.
type classifyMemo struct {
	runs [][2]int // the reads: sites [i, j) each
	img  []byte   // the last reads, one after another
	out  []State  // the states found in img (caller's order); nil until then
	cur  []byte   // scratch: this Classify's reads
	hits int      // Classifies answered from the memo (tests)
}

// classifyMemo is Classify through the memo: ok is false when the memo
// cannot be used (a run that crossed a gap), and the caller classifies as
// usual.
func (p *Prepared) classifyMemo(m Mem, out []State) ([]State, bool, error) {
	if len(p.cs) == 0 {
		return nil, false, nil
	}
	c := p.memo
	if c == nil {
		c = &classifyMemo{}
		ws, n := p.word, 0
		for i := 0; i < len(ws); {
			limit := ws[i].addr + MaxRead
			j := i + max(1, sort.Search(len(ws)-i, func(x int) bool {
				w := &ws[i+x]
				return w.addr+uint64(w.len) > limit
			}))
			c.runs = append(c.runs, [2]int{i, j})
			n += int(ws[j-1].addr + uint64(ws[j-1].len) - ws[i].addr)
			i = j
		}
		c.img, c.cur = make([]byte, n), make([]byte, n)
		p.memo = c
		p.imageBytes += 2 * n
	}
	ws, buf := p.word, c.cur
	for _, r := range c.runs {
		start := ws[r[0]].addr
		n := int(ws[r[1]-1].addr + uint64(ws[r[1]-1].len) - start)
		if err := m.ReadMem(start, buf[:n]); err != nil {
			if r[1] == r[0]+1 {
				return nil, false, err
			}
			return nil, false, nil // a gap: site by site, as classify does
		}
		buf = buf[n:]
	}
	if cap(out) >= len(p.cs) {
		out = out[:len(p.cs)]
	} else {
		out = make([]State, len(p.cs))
	}
	if c.out != nil && bytes.Equal(c.cur, c.img) {
		copy(out, c.out)
		c.hits++
		return out, true, nil
	}
	buf = c.cur
	for _, r := range c.runs {
		start := ws[r[0]].addr
		n := int(ws[r[1]-1].addr + uint64(ws[r[1]-1].len) - start)
		p.classifyRun(ws[r[0]:r[1]], r[0], buf[:n], start, out)
		buf = buf[n:]
	}
	c.img, c.cur = c.cur, c.img
	c.out = append(c.out[:0], out...)
	return out, true, nil
}
