package capture

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
	"github.com/edgeprobe/edgeprobe/internal/report"
	"github.com/edgeprobe/edgeprobe/internal/shm"
)

// TraceResult summarises a trace capture.
type TraceResult struct {
	Events   uint64 // events read from the rings
	Dropped  uint64 // events the runtime dropped because a ring was full
	Calls    uint64 // calls passed to the sink (Unwound and Open included)
	Unpaired uint64 // exits of calls that began before the capture
	Unwound  uint64 // calls that never returned (longjmp, exceptions)
	Open     uint64 // calls still running when the capture ended
	Duration time.Duration
	Limited  bool // the capture stopped at MaxCalls before Duration
	// RateEpochs is how many one-second quota epochs a --rate capture ran
	// (each function recorded at most Rate calls in each).
	RateEpochs int
}

// Trace enables the selection, switches the runtime's event rings on,
// drains them every few milliseconds for o.Duration into sink (as a
// well-formed call stream, see calltrace.Matcher), then switches them off,
// closes the sink and puts the probes back as they were.
func Trace(ctx context.Context, o Options, sink calltrace.Sink) (res *TraceResult, err error) {
	s, err := open(ctx, o)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := s.close(ctx); err == nil {
			err = cerr
		}
	}()
	if !s.region.Writable() {
		return nil, fmt.Errorf("%s is read-only to us: tracing needs to switch the rings on", s.region.Path())
	}
	res = &TraceResult{}
	m := calltrace.NewMatcher(sink)
	conv := newConverter(s.sym)
	var sinkErr error
	tids := map[int]int32{} // slot -> the thread that owns it now
	drain := func(keep bool) {
		for _, th := range s.region.Threads() {
			if _, ok := tids[th.Index]; !ok {
				tids[th.Index] = th.Tid
			}
			s.region.Consume(th.Index, func(e shm.Event) {
				if e.Kind == shm.EvThread {
					tids[th.Index] = int32(e.Addr) // the slot changed hands
					return
				}
				if !keep || res.Limited || sinkErr != nil {
					return
				}
				res.Events++
				if sinkErr = m.Add(conv.event(tids[th.Index], e)); sinkErr != nil {
					return
				}
				res.Limited = o.MaxCalls > 0 && m.Calls >= uint64(o.MaxCalls)
			})
		}
	}
	drain(false) // whatever an earlier tracer left behind
	if err := s.setFilters(o); err != nil {
		return nil, err
	}
	dropped0 := s.region.Counters().RingDropped
	if err := s.region.SetTrace(true); err != nil {
		return nil, err
	}
	start := time.Now()
	epochStart := start
	if o.Rate > 0 {
		// the first epoch starts with the events on: every call it
		// records is in the trace
		if _, err := s.region.NextQuotaEpoch(); err != nil {
			return nil, err
		}
		res.RateEpochs = 1
	}
	limitCtx, stopEarly := context.WithCancel(ctx)
	defer stopEarly()
	ticker(limitCtx, o.Duration, 5*time.Millisecond, o.Progress, func(time.Duration) string {
		if o.Rate > 0 && time.Since(epochStart) >= time.Second {
			epochStart = time.Now()
			if _, err := s.region.NextQuotaEpoch(); err == nil {
				res.RateEpochs++
			}
		}
		if drain(true); res.Limited || sinkErr != nil {
			stopEarly()
		}
		return fmt.Sprintf("%d calls", m.Calls)
	})
	offErr := s.region.SetTrace(false)
	res.Dropped = s.region.Counters().RingDropped - dropped0
	drain(true) // what the rings hold is kept unless the limit was reached
	res.Duration = time.Since(start)
	if sinkErr != nil {
		return res, sinkErr
	}
	if err := m.Close(); err != nil {
		return res, err
	}
	res.Calls, res.Unpaired, res.Unwound, res.Open = m.Calls, m.Unpaired, m.Unwound, m.Open
	return res, offErr
}

// converter turns the runtime's ring events into calltrace events, naming
// each function once. It is the one place that knows the ring encoding;
// a runtime with another encoding plugs in here.
type converter struct {
	sym   *report.Symbolizer
	funcs map[uint64]*calltrace.Function
	ev    calltrace.Event
}

func newConverter(sym *report.Symbolizer) *converter {
	return &converter{sym: sym, funcs: map[uint64]*calltrace.Function{}}
}

func (c *converter) event(tid int32, e shm.Event) *calltrace.Event {
	f := c.funcs[e.Addr]
	addr, bare := e.Addr&^shm.KeyBare, e.Addr&shm.KeyBare != 0
	if f == nil {
		name, obj := c.sym.Name(addr, !bare)
		f = &calltrace.Function{Addr: e.Addr, Name: name, Object: obj}
		c.funcs[e.Addr] = f
	}
	c.ev = calltrace.Event{Thread: tid, TimeNs: e.TimeNs, Func: f, Kind: calltrace.Exit}
	switch {
	case e.Kind == shm.EvEnter && bare:
		c.ev.Kind = calltrace.Instant // clang's entry-bare hook: no exit will come
	case e.Kind == shm.EvEnter:
		c.ev.Kind = calltrace.Entry
	}
	return &c.ev
}

// setFilters turns on the runtime's trace filters and rate limit that o
// asks for (before the events are), and marks them for close to undo.
func (s *session) setFilters(o Options) error {
	if o.MaxDepth < 0 {
		return fmt.Errorf("%w: depth %d", shm.ErrFilter, o.MaxDepth)
	}
	if o.MaxDepth > 0 || len(o.Tids) > 0 {
		tids := make([]int32, len(o.Tids))
		for i, t := range o.Tids {
			if t <= 0 || t > math.MaxInt32 {
				return fmt.Errorf("%w: thread id %d", shm.ErrFilter, t)
			}
			tids[i] = int32(t)
		}
		if err := s.region.SetFilter(uint32(min(o.MaxDepth, math.MaxInt32)), tids); err != nil {
			return err
		}
		s.filter = true
		if err := s.region.SetControl(shm.CtlFilter, 0); err != nil {
			return err
		}
	}
	if o.Rate > 0 {
		if o.Rate > math.MaxUint32 {
			return fmt.Errorf("%w: rate %d", shm.ErrFilter, o.Rate)
		}
		if err := s.region.SetQuota(uint32(o.Rate)); err != nil {
			return err
		}
		s.quota = true
		if err := s.region.SetControl(shm.CtlQuota, 0); err != nil {
			return err
		}
	}
	return nil
}
