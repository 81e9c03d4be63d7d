package xmod

import (
	"bytes"
	"errors"
	"fmt"
	"sort"
)

// Sentinel errors; every error the protocols return for a bad site wraps one.
var (
	// ErrInvalidSite: a site's forms are empty, of different lengths or equal,
	// or two sites of a batch overlap.
	ErrInvalidSite = errors.New("invalid site")
	// ErrNotFlippable: the site's forms differ in more than one byte, so a
	// single atomic byte store cannot toggle it.
	ErrNotFlippable = errors.New("site forms differ in more than one byte")
	// ErrUnexpectedBytes: the site's memory holds neither its active nor its
	// inert form (wrong bias, wrong binary, or someone else patched it). Such a
	// site is never written.
	ErrUnexpectedBytes = errors.New("site holds neither its active nor its inert form")
	// ErrBusy: the site already has an outstanding asynchronous patch.
	ErrBusy = errors.New("site has a patch in progress")
	// ErrRetries: the stop protocol kept finding a thread inside a site.
	ErrRetries = errors.New("a thread kept stopping inside a site")
	// ErrTorn: the site holds an int3 over bytes of its own forms: a patch
	// by an int3 protocol was interrupted (its tracer was killed). Repair
	// restores it; no protocol writes over it.
	ErrTorn = errors.New("site holds an int3 left by an interrupted patch")
)

// Site is one patchable instruction at a run-time address, with the bytes of
// its two valid forms (same length; each a whole instruction sequence that is
// valid to execute, and no PC lies strictly inside either).
type Site struct {
	Addr   uint64
	Active []byte
	Inert  []byte
	Name   string // for messages; optional
}

func (s Site) String() string {
	if s.Name != "" {
		return fmt.Sprintf("site %s at %#x", s.Name, s.Addr)
	}
	return fmt.Sprintf("site at %#x", s.Addr)
}

// Len is the site's length in bytes.
func (s Site) Len() int { return len(s.Active) }

// Differing returns the indices at which Active and Inert differ.
func (s Site) Differing() []int {
	var d []int
	for i := range s.Active {
		if s.Active[i] != s.Inert[i] {
			d = append(d, i)
		}
	}
	return d
}

func (s Site) form(on bool) []byte {
	if on {
		return s.Active
	}
	return s.Inert
}

func (s Site) check() error {
	switch {
	case len(s.Active) == 0 || len(s.Active) != len(s.Inert):
		return fmt.Errorf("%v: active form has %d bytes, inert form %d: %w", s, len(s.Active), len(s.Inert), ErrInvalidSite)
	case bytes.Equal(s.Active, s.Inert):
		return fmt.Errorf("%v: active and inert forms are equal: %w", s, ErrInvalidSite)
	case len(s.Active) > 15:
		return fmt.Errorf("%v: %d bytes is longer than any x86 instruction: %w", s, len(s.Active), ErrInvalidSite)
	}
	return nil
}

// Change asks for one site to be put in one form.
type Change struct {
	Site Site
	On   bool // true: the Active form; false: the Inert form
}

// State is what a site's memory holds.
type State uint8

// States.
const (
	StateInvalid State = iota // neither form
	StateInert
	StateActive
	// StateTorn: byte 0 is an int3 and every other byte belongs to one of
	// the two forms, as an int3 protocol leaves a site mid-patch; what an
	// interrupted (killed) hotpatch leaves behind. See Repair.
	StateTorn
)

func (s State) String() string {
	switch s {
	case StateInert:
		return "inert"
	case StateActive:
		return "active"
	case StateTorn:
		return "torn"
	}
	return "invalid"
}

func classify(s Site, seen []byte) State {
	switch {
	case bytes.Equal(seen, s.Active):
		return StateActive
	case bytes.Equal(seen, s.Inert):
		return StateInert
	case len(seen) != len(s.Active) || len(seen) == 0 || seen[0] != int3:
		return StateInvalid
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] != s.Active[i] && seen[i] != s.Inert[i] {
			return StateInvalid
		}
	}
	return StateTorn
}

// SiteError reports a site whose memory holds neither form.
type SiteError struct {
	Site Site
	Seen []byte
}

func (e *SiteError) Error() string {
	if classify(e.Site, e.Seen) == StateTorn {
		return fmt.Sprintf("%v holds % x: an int3 left by an interrupted patch over its own bytes (active % x, inert % x); hotpatch repairs it",
			e.Site, e.Seen, e.Site.Active, e.Site.Inert)
	}
	return fmt.Sprintf("%v holds % x, which is neither its active form (% x) nor its inert form (% x)",
		e.Site, e.Seen, e.Site.Active, e.Site.Inert)
}

// Unwrap gives ErrUnexpectedBytes, and ErrTorn too for a torn site.
func (e *SiteError) Unwrap() []error {
	if classify(e.Site, e.Seen) == StateTorn {
		return []error{ErrUnexpectedBytes, ErrTorn}
	}
	return []error{ErrUnexpectedBytes}
}

// Result summarises a batch.
type Result struct {
	Changed   int // sites written
	Unchanged int // sites already in the requested form
	Held      int // threads caught at an int3 and resumed at their site
}

// Mem reads and writes the target's memory: *ptrace.Tracer and *ptrace.Mem.
type Mem interface {
	ReadMem(addr uint64, b []byte) error
	WriteMem(addr uint64, b []byte) error
}

// validate checks every site and that no two overlap (the disjoint-update
// rule), returning the changes sorted by address.
func validate(changes []Change) ([]Change, error) {
	cs := append([]Change(nil), changes...)
	if byAddr := func(i, j int) bool { return cs[i].Site.Addr < cs[j].Site.Addr }; !sort.SliceIsSorted(cs, byAddr) {
		sort.SliceStable(cs, byAddr)
	}
	for i, c := range cs {
		if err := c.Site.check(); err != nil {
			return nil, err
		}
		if i > 0 {
			p := cs[i-1].Site
			if p.Addr+uint64(p.Len()) > c.Site.Addr {
				return nil, fmt.Errorf("%v overlaps %v: %w", c.Site, p, ErrInvalidSite)
			}
		}
	}
	return cs, nil
}

const pageSize = 4096

// readSites reads the current bytes of every site (sorted by address), one
// read per run of sites within one page.
func readSites(m Mem, cs []Change) ([][]byte, error) {
	out := make([][]byte, len(cs))
	for i := 0; i < len(cs); {
		start := cs[i].Site.Addr
		j, end := i, start
		for j < len(cs) {
			s := cs[j].Site
			e := s.Addr + uint64(s.Len())
			if (e-1)/pageSize != start/pageSize && j > i {
				break
			}
			end = e
			j++
		}
		buf := make([]byte, end-start)
		if err := m.ReadMem(start, buf); err != nil {
			return nil, err
		}
		for k := i; k < j; k++ {
			off := cs[k].Site.Addr - start
			out[k] = buf[off : off+uint64(cs[k].Site.Len())]
		}
		i = j
	}
	return out, nil
}

// plan reads every site and splits the batch into the sites to change and a
// count of those already right. Any site in neither form fails the whole
// batch before anything is written; the error lists every such site.
func plan(m Mem, cs []Change) (todo []Change, old [][]byte, unchanged int, err error) {
	cur, err := readSites(m, cs)
	if err != nil {
		return nil, nil, 0, err
	}
	var bad []error
	for i, c := range cs {
		switch classify(c.Site, cur[i]) {
		case StateInvalid, StateTorn:
			bad = append(bad, &SiteError{Site: c.Site, Seen: append([]byte(nil), cur[i]...)})
		case StateActive:
			if c.On {
				unchanged++
				continue
			}
			todo, old = append(todo, c), append(old, cur[i])
		case StateInert:
			if !c.On {
				unchanged++
				continue
			}
			todo, old = append(todo, c), append(old, cur[i])
		}
	}
	if len(bad) > 0 {
		return nil, nil, 0, errors.Join(bad...)
	}
	return todo, old, unchanged, nil
}

// Classify reads each site and reports which form it holds; sites within
// DefaultMaxSpan bytes of each other share one read (ClassifyRuns).
func Classify(m Mem, sites []Site) ([]State, error) {
	return ClassifyRuns(m, sites, 0)
}
