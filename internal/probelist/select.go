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

// ErrNoExitSite is returned by Select when an exit-only selector names fentry
// probes: an fentry function has no exit site in the binary. Its exits are
// produced by the runtime, which hijacks the return address while the entry
// probe is on (EDGEPROBE_FENTRY_EXITS=1, the default), so the way to get them
// is to select the entry probe (kind entry or both).
var ErrNoExitSite = errors.New("fentry probes have no exit site")

// Kind filters for Select.
const (
	KindBoth = "both"
)

// ProviderAll selects the probes of every provider.
const ProviderAll = "all"

// Selector picks probes by function name, glob or id, kind and provider.
type Selector struct {
	Pattern  string // function name, glob ('http_*', '*'), or "id:N"
	Kind     string // KindEntry, KindExit or KindBoth ("" is both)
	Provider string // ProviderCyg, ProviderFentry or ProviderAll ("" is all)
}

// ParseProvider checks a provider filter: cyg, fentry or all ("" is all).
func ParseProvider(provider string) (string, error) {
	switch provider {
	case "", ProviderAll:
		return ProviderAll, nil
	case ProviderCyg, ProviderFentry:
		return provider, nil
	}
	return "", fmt.Errorf("provider %q is not cyg, fentry or all", provider)
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
	return s.matchIgnoringKind(p)
}

func (s Selector) matchIgnoringKind(p *Probe) bool {
	if s.Provider != "" && s.Provider != ProviderAll && s.Provider != p.Provider {
		return false
	}
	if id, ok := strings.CutPrefix(s.Pattern, "id:"); ok {
		return strconv.Itoa(p.ID) == id
	}
	ok, _ := path.Match(s.Pattern, p.Function) // syntax checked by ParseSelector
	return ok
}

// noExitSite reports whether p is an fentry probe that s would select but
// for asking for exits only.
func (s Selector) noExitSite(p *Probe) bool {
	return s.Kind == KindExit && p.Provider == ProviderFentry && s.matchIgnoringKind(p)
}

func noExitSiteError(s Selector, p *Probe, more int) error {
	also := ""
	if more > 0 {
		also = fmt.Sprintf(" and %d more", more)
	}
	return fmt.Errorf("%w: selector %q with kind exit names the fentry probe of %s%s; an fentry function's exits come from the runtime "+
		"while its entry probe is on (EDGEPROBE_FENTRY_EXITS=1, the default): select kind entry or both, or provider cyg for -finstrument-functions exits only",
		ErrNoExitSite, s.Pattern, p.Function, also)
}

// Select returns the indices of the probes s matches, or ErrNoMatch. A
// selector for exits only that names an fentry probe is refused with
// ErrNoExitSite rather than quietly leaving that function without exits.
func (l *List) Select(s Selector) ([]int, error) {
	return selectProbes(s, len(l.Probes), func(yield func(int) bool) {
		for i := range l.Probes {
			if !yield(i) {
				return
			}
		}
	}, func(i int) (*Probe, error) { return &l.Probes[i], nil })
}

// selectProbes is Select over n probes, of which only the candidates (in
// ascending order) may match s's pattern; get returns one probe.
func selectProbes(s Selector, n int, candidates func(yield func(int) bool), get func(int) (*Probe, error)) ([]int, error) {
	if id, ok := strings.CutPrefix(s.Pattern, "id:"); ok {
		// Ids are indices: no scan (Restore selects thousands by id).
		if n2, err := strconv.Atoi(id); err == nil && n2 >= 0 && n2 < n {
			p, err := get(n2)
			if err != nil {
				return nil, err
			}
			if s.Match(p) {
				return []int{n2}, nil
			}
			if s.noExitSite(p) {
				return nil, noExitSiteError(s, p, 0)
			}
		}
		return nil, fmt.Errorf("%w %q", ErrNoMatch, s.Pattern)
	}
	var idx, fentry []int
	var firstFentry *Probe
	var err error
	candidates(func(i int) bool {
		var p *Probe
		if p, err = get(i); err != nil {
			return false
		}
		if s.Match(p) {
			idx = append(idx, i)
		} else if s.noExitSite(p) {
			if fentry == nil {
				firstFentry = p
			}
			fentry = append(fentry, i)
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	if len(fentry) > 0 {
		return nil, noExitSiteError(s, firstFentry, len(fentry)-1)
	}
	if len(idx) == 0 {
		return nil, fmt.Errorf("%w %q", ErrNoMatch, s.Pattern)
	}
	return idx, nil
}
