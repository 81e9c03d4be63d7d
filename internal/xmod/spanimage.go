package xmod

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
	bytes    int                // held in old and new, to bound a session's memory
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
			si.bytes -= 2 * len(im.old)
		}
		im = &spanImage{old: make([]byte, len(old)), new: make([]byte, len(new))}
		si.runs[first] = im
		si.bytes += 2 * len(old)
	}
	im.start, im.last = start, last
	copy(im.old, old)
	copy(im.new, new)
}

// drop forgets the span starting at site first (its write raced).
func (si *spanImages) drop(first int) {
	if im := si.runs[first]; im != nil {
		si.bytes -= 2 * len(im.old)
		delete(si.runs, first)
	}
}

// contiguous reports whether run (sorted indices) holds every index from
// its first to its last: only such a span is identified by its ends.
func contiguous(run []int) bool {
	return run[len(run)-1]-run[0] == len(run)-1
}

// ImageBytes is the memory the Prepared holds in span images.
func (p *Prepared) ImageBytes() int {
	if p.images == nil {
		return 0
	}
	return p.images.bytes
}

// DropImages forgets the span images (a session bounding its memory).
func (p *Prepared) DropImages() { p.images = nil }
