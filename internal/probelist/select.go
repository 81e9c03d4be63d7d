package probelist

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
)

// ErrNoMatch is returned by Select when a selector matches no probe.
var ErrNoMatch = errors.New("no probe matched")

// Kind filters for Select.
const (
	KindBoth = "both"
)

// Selector picks probes by function name, glob or id, and kind.
type Selector struct {
	Pattern string // function name, glob ('http_*', '*'), or "id:N"
	Kind    string // KindEntry, KindExit or KindBoth ("" is both)
}

// ParseSelector checks a selector's syntax, so a typo fails before any
// process is touched.
func ParseSelector(pattern, kind string) (Selector, error) {
	switch kind {
	case "", KindBoth, KindEntry, KindExit:
	default:
		return Selector{}, fmt.Errorf("kind %q is not entry, exit or both", kind)
	}
	if pattern == "" {
		return Selector{}, errors.New("empty probe selector")
	}
	if id, ok := strings.CutPrefix(pattern, "id:"); ok {
		if n, err := strconv.Atoi(id); err != nil || n < 0 {
			return Selector{}, fmt.Errorf("selector %q: id must be a non-negative integer", pattern)
		}
	} else if _, err := path.Match(pattern, ""); err != nil {
		return Selector{}, fmt.Errorf("selector %q: bad glob: %v", pattern, err)
	}
	return Selector{Pattern: pattern, Kind: kind}, nil
}

// Match reports whether p is selected. A name selects every copy of the
// function: its own site and the sites inlined into other functions, because
// Function names the function the hook reports, not the container.
func (s Selector) Match(p *Probe) bool {
	if s.Kind != "" && s.Kind != KindBoth && s.Kind != p.Kind {
		return false
	}
	if id, ok := strings.CutPrefix(s.Pattern, "id:"); ok {
		return strconv.Itoa(p.ID) == id
	}
	ok, _ := path.Match(s.Pattern, p.Function) // syntax checked by ParseSelector
	return ok
}

// Select returns the indices of the probes s matches, or ErrNoMatch.
func (l *List) Select(s Selector) ([]int, error) {
	if id, ok := strings.CutPrefix(s.Pattern, "id:"); ok {
		// Ids are indices: no scan (Restore selects thousands by id).
		if n, err := strconv.Atoi(id); err == nil && n >= 0 && n < len(l.Probes) && s.Match(&l.Probes[n]) {
			return []int{n}, nil
		}
		return nil, fmt.Errorf("%w %q", ErrNoMatch, s.Pattern)
	}
	var idx []int
	for i := range l.Probes {
		if s.Match(&l.Probes[i]) {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return nil, fmt.Errorf("%w %q", ErrNoMatch, s.Pattern)
	}
	return idx, nil
}
