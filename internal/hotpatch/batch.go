package hotpatch

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// ErrNeedsFullAttach is returned by Apply inside Batch when a request needs
// every thread traced (a protocol other than flip) while the session holds
// only the leader: the caller runs that request outside Batch, which
// attaches as needed. Nothing was read or written.
var ErrNeedsFullAttach = errors.New("request needs every thread traced")

// Batch runs fn on the tracer's thread, attaching (the leader only, as
// flip needs) first: every Apply inside it reads, writes and reads back
// without a hand-off to the tracer thread, which is what lets a session
// (hotpatch session) sustain a toggle in microseconds. While fn runs the
// tracer serves nothing else, so fn must not block on anything but the
// target's memory: read the commands first, then Batch them.
func (s *Session) Batch(fn func() error) error {
	if err := s.reanchor(); err != nil { // the tracer may not change inside
		return err
	}
	if err := s.attach(false); err != nil {
		return err
	}
	return s.tracer.DoMem(func(m *ptrace.ThreadMem) error {
		s.inBatch, s.threadMem = true, m
		defer func() { s.inBatch, s.threadMem = false, nil }()
		return fn()
	})
}

// writer is what flip batches write through: inside Batch the memory the
// tracer thread lent it (no hand-off, no thread check per write), outside
// it the tracer (one hand-off per batch).
func (s *Session) writer() xmod.Mem {
	if s.threadMem != nil {
		return s.threadMem
	}
	return s.tracer
}

// prepared is what one list of actions (with one protocol) selects, with
// what every Apply of it needs computed once: a session script toggles the
// same few selections over and over, and the targets (hence what a
// selector matches) do not change during a Session. A 40,000-site batch
// would otherwise build, name, sort and check its sites, look each up in
// the verified set and format its address on every call.
type prepared struct {
	sel      []selected
	targets  []*Target   // the targets sel's sites lie in (checkMapped)
	sites    []xmod.Site // sel's sites, in sel's order
	protoOf  []string    // each site's protocol
	byProto  map[string][]xmod.Change
	onlyFlip bool
	protoErr error          // --protocol flip asked of a site it cannot toggle
	batch    *xmod.Prepared // every site: the reads, and the writes when onlyFlip
	verified bool           // listed probes checked against a scan (verify)
	// genKey[i]: the run-time address of sel[i]'s function, the runtime's
	// key for a new generation (newGeneration), when sel[i] enables a
	// probe whose function is known; 0 otherwise.
	genKey []uint64
	want   []xmod.State // each site's asked state: the result is OK when the read after equals it
	// Scratch reused by each Apply (a Session is used by one goroutine).
	before, after []xmod.State
	gen           []uint64
	addrs         []string // run-time addresses, formatted on first need
}

// maxPreparedSites bounds the sites a session keeps prepared (a profile
// builds a new selection per epoch); past it the cache starts over.
const maxPreparedSites = 1 << 20

// prepare returns the prepared selection of actions under protocol,
// building it on first use.
func (s *Session) prepare(actions []Action, protocol string) (*prepared, error) {
	b := s.key(actions, protocol)
	if p, ok := s.prepared[string(b)]; ok {
		return p, nil
	}
	key := string(b)
	sel, err := resolve(s.targets, actions)
	if err != nil {
		return nil, err
	}
	p := &prepared{sel: sel, sites: make([]xmod.Site, len(sel)), protoOf: make([]string, len(sel)), byProto: map[string][]xmod.Change{},
		genKey: make([]uint64, len(sel)), want: make([]xmod.State, len(sel))}
	all := make([]xmod.Change, len(sel))
	var curProto string
	var cur []xmod.Change
	for i, c := range sel {
		if c.on && c.probe.Resolved && c.probe.FunctionAddress != 0 {
			p.genKey[i] = c.target.Object.Runtime(uint64(c.probe.FunctionAddress))
		}
		p.want[i] = stateOf(c.on)
		if !slices.Contains(p.targets, c.target) {
			p.targets = append(p.targets, c.target)
		}
		p.sites[i] = siteOf(c)
		all[i] = xmod.Change{Site: p.sites[i], On: c.on}
		pr := protocolFor(protocol, c.probe)
		if pr == ProtoFlip && c.probe.DifferingBytes() != 1 && p.protoErr == nil {
			p.protoErr = fmt.Errorf("probe %d (%s %s) is a %s placeholder: %w; use --protocol auto or int3",
				c.probe.ID, c.probe.Kind, c.probe.Function, c.probe.Placeholder, ErrNotFlippable)
		}
		p.protoOf[i] = pr
		// Sites of one protocol come in runs: the map is touched when the
		// protocol changes, not per site.
		if pr != curProto {
			if curProto != "" {
				p.byProto[curProto] = cur
			}
			curProto, cur = pr, p.byProto[pr]
			if cur == nil {
				cur = make([]xmod.Change, 0, len(sel))
			}
		}
		cur = append(cur, all[i])
	}
	if curProto != "" {
		p.byProto[curProto] = cur
	}
	p.onlyFlip = len(p.byProto) == 1 && p.byProto[ProtoFlip] != nil
	if p.batch, err = xmod.Prepare(all); err != nil {
		return nil, err
	}
	// A large selection keeps what it read and checked, from its second
	// use on (D61); boundImages bounds the session's total.
	p.batch.KeepImages(len(sel) >= spanMin)
	if s.prepared == nil || s.preparedSites+len(sel) > maxPreparedSites || len(s.prepared) >= 4096 {
		s.prepared, s.preparedSites, s.imaged = map[string]*prepared{}, 0, nil
	}
	s.prepared[key] = p
	s.preparedSites += len(sel)
	return p, nil
}

// key is the key of actions under protocol in s.prepared, in a reused
// buffer: a lookup with string(b) does not allocate, and a session looks
// one up per command.
func (s *Session) key(actions []Action, protocol string) []byte {
	b := append(s.keyBuf[:0], protocol...)
	b = append(b, 1)
	for _, a := range actions {
		if a.Enable {
			b = append(b, '+')
		} else {
			b = append(b, '-')
		}
		b = append(b, a.Selector.Pattern...)
		b = append(b, 0)
		b = append(b, a.Selector.Kind...)
		b = append(b, 0)
		b = append(b, a.Selector.Provider...)
		b = append(b, 0)
		b = append(b, a.Object...)
		b = append(b, 1)
	}
	s.keyBuf = b
	return b
}

// results is every site's SiteResult for one Apply.
func (p *prepared) results(before, after []xmod.State, afterErr error) []SiteResult {
	if p.addrs == nil {
		p.addrs = make([]string, len(p.sel))
		for i := range p.sel {
			p.addrs[i] = "0x" + strconv.FormatUint(p.sites[i].Addr, 16)
		}
	}
	out := make([]SiteResult, len(p.sel))
	for i, c := range p.sel {
		r := &out[i]
		*r = SiteResult{Object: c.target.Object.Path, ID: c.probe.ID, Function: c.probe.Function, Kind: c.probe.Kind, Provider: c.probe.Provider,
			Address: p.addrs[i], Want: onOff(c.on), Before: stateName(before[i]), Protocol: p.protoOf[i], After: "unknown"}
		if afterErr == nil {
			r.After = stateName(after[i])
		}
	}
	return out
}
