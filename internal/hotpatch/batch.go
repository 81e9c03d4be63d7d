package hotpatch

import (
	"errors"
	"strings"
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
	if err := s.attach(false); err != nil {
		return err
	}
	s.inBatch = true
	defer func() { s.inBatch = false }()
	return s.tracer.Do(fn)
}

// resolveCached is resolve, remembered per list of actions: a session
// script toggles the same few selections over and over, and the targets
// (hence what a selector matches) do not change during a Session.
func (s *Session) resolveCached(actions []Action) ([]selected, error) {
	var b strings.Builder
	for _, a := range actions {
		if a.Enable {
			b.WriteByte('+')
		} else {
			b.WriteByte('-')
		}
		b.WriteString(a.Selector.Pattern)
		b.WriteByte(0)
		b.WriteString(a.Selector.Kind)
		b.WriteByte(0)
		b.WriteString(a.Selector.Provider)
		b.WriteByte(0)
		b.WriteString(a.Object)
		b.WriteByte(1)
	}
	key := b.String()
	if sel, ok := s.resolved[key]; ok {
		return sel, nil
	}
	sel, err := resolve(s.targets, actions)
	if err != nil {
		return nil, err
	}
	if s.resolved == nil || len(s.resolved) >= 4096 {
		s.resolved = map[string][]selected{}
	}
	s.resolved[key] = sel
	return sel, nil
}
