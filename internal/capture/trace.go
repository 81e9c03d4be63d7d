package capture

import (
	"context"
	"fmt"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/report"
	"github.com/edgeprobe/edgeprobe/internal/shm"
)

// TraceResult summarises a trace capture.
type TraceResult struct {
	Tracer   *report.Tracer
	Events   uint64 // events read from the rings
	Dropped  uint64 // events the runtime dropped because a ring was full
	Duration time.Duration
	Limited  bool // the capture stopped at MaxCalls before Duration
}

// Trace enables the selection, switches the runtime's event rings on,
// drains them every few milliseconds for o.Duration, then switches them off
// and puts the probes back as they were.
func Trace(ctx context.Context, o Options) (res *TraceResult, err error) {
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
	res = &TraceResult{Tracer: report.NewTracer(o.PID, s.sym)}
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
				if keep && !res.Limited {
					res.Events++
					res.Tracer.Add(tids[th.Index], e)
					res.Limited = o.MaxCalls > 0 && res.Tracer.Calls() >= o.MaxCalls
				}
			})
		}
	}
	drain(false) // whatever an earlier tracer left behind
	dropped0 := s.region.Counters().RingDropped
	if err := s.region.SetTrace(true); err != nil {
		return nil, err
	}
	start := time.Now()
	limitCtx, stopAtLimit := context.WithCancel(ctx)
	defer stopAtLimit()
	ticker(limitCtx, o.Duration, 5*time.Millisecond, o.Progress, func(time.Duration) string {
		if drain(true); res.Limited {
			stopAtLimit()
		}
		return fmt.Sprintf("%d calls", res.Tracer.Calls())
	})
	offErr := s.region.SetTrace(false)
	res.Dropped = s.region.Counters().RingDropped - dropped0
	drain(true) // what the rings hold is kept unless the limit was reached
	res.Duration = time.Since(start)
	return res, offErr
}
