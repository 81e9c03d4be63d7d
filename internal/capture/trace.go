package capture

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
	"github.com/edgeprobe/edgeprobe/internal/hotpatch"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/report"
	"github.com/edgeprobe/edgeprobe/internal/shm"
	"golang.org/x/sys/unix"
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
	// RateInFlight is how many threads were still inside a hook that had
	// taken a quota slot when the capture ended (D55): 0 unless a thread
	// was stopped or a signal handler longjmp'd out of a hook; then the
	// calls of those hooks may be missing from the trace.
	RateInFlight int
	// QuotaHeld names the functions the capture did not select (--enable)
	// that recorded calls under its rate limit: the quota is process-wide
	// (D57), so those were held to the rate too.
	QuotaHeld []string
	// Stale is how many events were left out because their hook decided
	// them under a control word from before the capture started (D79): a
	// thread preempted inside a hook while the previous capture ended and
	// this one started, writing late an event of the previous capture's
	// filters.
	Stale uint64
	// Unloaded names the objects the process unloaded during the capture
	// (D80), each when the capture saw it: calls of their functions end
	// there. The trace holds an Unloaded event for each too.
	Unloaded []UnloadedObject
	// QuietTids are the threads --tid named that recorded no event, with
	// what they did meanwhile (D81): a thread that did not run at all (a
	// loaded machine's scheduler may leave a runnable thread off the CPUs
	// for the whole capture) is not a filter that left it out.
	QuietTids []QuietThread
	// ArgFuncs is how many functions' arguments or return values were
	// recorded; Notes say what --args/--retval matched but could not record.
	ArgFuncs int
	Notes    []string
	// RingEvents is the ring size the capture ran with, RingCapacity the
	// largest it could have asked for without restarting the process.
	RingEvents, RingCapacity uint32
	// Threads: per thread, the events kept and those its full ring
	// dropped, busiest first.
	Threads []ThreadDrops
}

// UnloadedObject is an object the process unloaded during a capture.
type UnloadedObject struct {
	Object string `json:"object"`
	// AfterNs: how long into the capture it was seen gone (the capture
	// looks every 50 ms).
	AfterNs int64 `json:"after_ns"`
}

// QuietThread is a thread --tid named that recorded no event.
type QuietThread struct {
	Tid int `json:"tid"`
	// RanNs is its time on a CPU while the events were on (-1: it began
	// during the capture); Gone: it had ended (or never existed) by the
	// capture's end.
	RanNs int64  `json:"ran_ns"`
	Gone  bool   `json:"gone"`
	State string `json:"state,omitempty"` // its state at the end (R, S, D, T, t, ...)
}

// ThreadDrops is one thread's share of a capture.
type ThreadDrops struct {
	Tid     int32  `json:"tid"`
	Events  uint64 `json:"events"`
	Dropped uint64 `json:"dropped"`
}

// SuggestRing is a ring size that would have kept what r dropped whatever
// the timing of the drains: one that holds the busiest thread's whole
// capture, as a power of two up to the capacity the process reserved; 0
// when nothing was dropped. (Rates averaged over the capture say nothing of
// bursts, which is when rings fill.)
func (r *TraceResult) SuggestRing() uint32 {
	if r.Dropped == 0 {
		return 0
	}
	var busiest uint64
	for _, t := range r.Threads {
		busiest = max(busiest, t.Events+t.Dropped)
	}
	n := uint64(max(r.RingEvents, 1)) * 2
	for n <= busiest {
		n *= 2
	}
	return uint32(min(n, uint64(max(r.RingCapacity, r.RingEvents))))
}

// drainPeriod is how often a trace empties the rings.
const drainPeriod = 5 * time.Millisecond

// quotaWait bounds how long a --rate capture's end waits for hooks in flight
// (D55): a running hook takes nanoseconds; one that has not finished in a
// second is stopped or abandoned.
const quotaWait = time.Second

// Trace enables the selection, switches the runtime's event rings on,
// drains them every few milliseconds for o.Duration into sink (as a
// well-formed call stream, see calltrace.Matcher), then switches them off,
// closes the sink and puts the probes back as they were.
func Trace(ctx context.Context, o Options, sink calltrace.Sink) (res *TraceResult, err error) {
	if len(o.Args) > 0 && o.MinDuration > 0 {
		// The runtime writes an args record only right after its call's
		// enter event; --min-duration writes the enter at the exit, with
		// nothing to put after it (docs/tracing.md).
		return nil, fmt.Errorf("%w: not with a minimum duration (held-back enters are written without them)", ErrArgs)
	}
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
	var plans map[uint64]*argFunc
	if len(o.Args)+len(o.Retval) > 0 {
		var sites []hotpatch.SiteResult
		if s.enabled != nil {
			sites = s.enabled.Sites
		} else {
			// No --enable: the probes that are on now, whichever they are;
			// a plan for a function whose probe is off costs nothing.
			sites = probeSites(s.hp.Targets(), append(append([]string(nil), o.Args...), o.Retval...))
		}
		if plans, res.Notes, err = planArgs(o.PID, s.hp.Targets(), sites, o.Args, o.Retval); err != nil {
			return nil, err
		}
		specs := map[uint64]uint64{}
		for k, f := range plans {
			specs[k] = f.spec()
		}
		if err := s.region.SetArgPlans(specs); err != nil {
			return nil, fmt.Errorf("%v: %w", err, ErrArgs)
		}
		defer s.region.ClearArgPlans()
		res.ArgFuncs = len(plans)
	}
	m := calltrace.NewMatcher(sink)
	conv := newConverter(s.sym)
	var sinkErr error
	tids := map[int]int32{} // slot -> the thread that owns it now
	// An entry (exit) of a function whose arguments (return value) are
	// recorded waits for the data record that follows it in its ring,
	// published a moment after the event itself, perhaps after this drain.
	type held struct {
		tid int32
		e   shm.Event
		f   *argFunc
	}
	pend := map[int]*held{}
	perTid := map[int32]*ThreadDrops{}
	thread := func(tid int32) *ThreadDrops {
		t := perTid[tid]
		if t == nil {
			t = &ThreadDrops{Tid: tid}
			perTid[tid] = t
		}
		return t
	}
	add := func(tid int32, e shm.Event, args []calltrace.Value, ret *calltrace.Value) {
		if res.Limited || sinkErr != nil {
			return
		}
		res.Events++
		thread(tid).Events++
		ev := conv.event(tid, e)
		ev.Args, ev.Ret = args, ret
		if sinkErr = m.Add(ev); sinkErr != nil {
			return
		}
		res.Limited = o.MaxCalls > 0 && m.Calls >= uint64(o.MaxCalls)
	}
	lastDropped := map[int]uint64{} // each slot's drop count at its last drain
	// flush: the held event had no record; ringFull says the thread lost
	// events right after it (else the ring is not to blame, unless it
	// dropped some since the last drain: it may have been read from
	// while the runtime dropped the record).
	flush := func(slot int, ringFull bool) {
		h := pend[slot]
		if h == nil {
			return
		}
		delete(pend, slot)
		ringFull = ringFull || s.region.RingDropped(slot) != lastDropped[slot]
		if h.e.Kind == shm.EvEnter {
			why := noArgMissing
			if ringFull {
				why = noArgRecord
			}
			add(h.tid, h.e, missingArgs(h.f, why), nil)
		} else {
			add(h.tid, h.e, nil, missingRet(h.f, noRetRecord))
		}
	}
	withData := func(slot int, e shm.Event) {
		h := pend[slot]
		if h == nil || h.e.Addr != e.Addr || (e.Sub == shm.DataArgs) != (h.e.Kind == shm.EvEnter) {
			return // a record whose event was consumed without it (a capture before this one)
		}
		delete(pend, slot)
		if e.Sub == shm.DataArgs {
			args := missingArgs(h.f, badRecord)
			if r, ok := entryRegs(e.Spec, e.Data); ok && covers(e.Spec, h.f.plan, true) {
				args = h.f.sig.DecodeArgs(r)
			}
			add(h.tid, h.e, args, nil)
			return
		}
		ret := missingRet(h.f, badRecord)
		if r, ok := exitRegs(e.Spec, e.Data); ok && covers(e.Spec, h.f.plan, false) {
			ret = h.f.sig.DecodeRet(r)
		}
		add(h.tid, h.e, nil, ret)
	}
	// Drops: a full ring drops the newest events, so what a drain finds
	// dropped since the last one was lost after the events it consumed; a
	// Lost event marks the gap there, on the thread's track.
	lastNs := map[int]uint64{}
	lost := func(slot int, keep bool) {
		d := s.region.RingDropped(slot)
		delta := d - lastDropped[slot]
		lastDropped[slot] = d
		if !keep || delta == 0 || res.Limited || sinkErr != nil {
			return
		}
		flush(slot, true)
		ts := lastNs[slot]
		if ts == 0 {
			ts = monoNow()
		}
		ev := calltrace.Event{Kind: calltrace.Lost, Thread: tids[slot], TimeNs: ts, Count: delta}
		sinkErr = m.Add(&ev)
	}
	// The capture's generation (D79): the events it keeps are those its
	// hooks decided under a control|gen word of it or a later one.
	stamps, gen0 := s.region.Stamps(), uint32(0)
	drain := func(keep bool) {
		for _, th := range s.region.Threads() {
			if _, ok := tids[th.Index]; !ok {
				tids[th.Index] = th.Tid
			}
			s.region.Consume(th.Index, func(e shm.Event) {
				if e.TimeNs != 0 {
					lastNs[th.Index] = e.TimeNs
				}
				if e.Kind == shm.EvThread {
					flush(th.Index, false)
					tids[th.Index] = int32(e.Addr) // the slot changed hands
					return
				}
				if !keep || res.Limited || sinkErr != nil {
					return
				}
				if stamps && (!e.Stamped || int32(e.Gen-gen0) < 0) {
					// decided under a word from before the capture (its
					// records, stamped alike, go with it)
					if e.Kind == shm.EvEnter || e.Kind == shm.EvExit {
						res.Stale++
					}
					return
				}
				if e.Kind == shm.EvData {
					withData(th.Index, e)
					return
				}
				flush(th.Index, false)
				if f := plans[e.Addr]; f != nil && (e.Kind == shm.EvEnter && f.args || e.Kind == shm.EvExit && f.rets) {
					pend[th.Index] = &held{tids[th.Index], e, f}
					return
				}
				add(tids[th.Index], e, nil, nil)
			})
			lost(th.Index, keep)
		}
	}
	drain(false) // whatever an earlier tracer left behind
	var before map[uint64]shm.Func
	if o.Rate > 0 {
		before = byAddr(s.region.Functions())
	}
	if err := s.setFilters(o); err != nil {
		return nil, err
	}
	res.RingCapacity, res.RingEvents = s.region.RingCapacity(), s.region.RingDefault()
	// A capture killed before it could put things back (SIGKILL) may have
	// left bigger rings asked for (its control bits, plans, quota and
	// filters open's resetStale cleared): this capture starts from the
	// defaults unless it asks otherwise.
	if req := s.region.Header().RingReq; o.RingEvents != 0 || req != 0 && req != s.region.RingDefault() {
		// The rings are empty now: each thread takes the new size at its
		// first event of the capture.
		if err := s.region.SetRingEvents(o.RingEvents); err != nil {
			return nil, err
		}
		if o.RingEvents != 0 {
			res.RingEvents = o.RingEvents
		}
		defer func() {
			s.region.SetRingEvents(0)
			s.region.ReleaseRings() // after the last drain: what is left was consumed
		}()
	}
	dropped0 := s.region.Counters().RingDropped
	slotDropped0 := map[int]uint64{}
	for _, th := range s.region.Threads() {
		slotDropped0[th.Index] = th.RingDropped
	}
	ctl := shm.CtlTrace
	if plans != nil {
		ctl |= shm.CtlArgs // with the rings, in one store: no event without its record
	}
	if o.Rate > 0 {
		// The first epoch starts with the events on, and the hooks decide
		// each call's event by the epoch its quota slot was counted in
		// (D55): every call the quota records from now on is in the trace,
		// none from before.
		if _, gen0, err = s.region.StartQuotaTrace(ctl); err != nil {
			return nil, err
		}
		defer s.region.ClearQuotaTrace() // after the last drain
		res.RateEpochs = 1
	} else if gen0, err = s.region.StartTrace(ctl); err != nil {
		return nil, err
	}
	start := time.Now()
	epochStart := start
	// what each listed thread had run when the events went on (D81)
	ran0 := map[int]time.Duration{}
	for _, tid := range o.Tids {
		if d, err := procfs.CPUTime(o.PID, tid); err == nil {
			ran0[tid] = d
		}
	}
	// unloaded looks for objects the process unloaded (D80): each is said
	// once, in the result, the notes and the trace (an Unloaded event).
	gone := map[string]bool{}
	unloaded := func() {
		for _, path := range s.hp.Unmapped() {
			if gone[path] || res.Limited || sinkErr != nil {
				continue
			}
			gone[path] = true
			after := time.Since(start)
			res.Unloaded = append(res.Unloaded, UnloadedObject{Object: path, AfterNs: after.Nanoseconds()})
			res.Notes = append(res.Notes, fmt.Sprintf("the process unloaded %s %s into the trace: the probes in it went with it", path, after.Round(time.Millisecond)))
			ev := calltrace.Event{Kind: calltrace.Unloaded, Thread: int32(o.PID), TimeNs: monoNow(), Func: &calltrace.Function{Object: path}}
			sinkErr = m.Add(&ev)
		}
	}
	limitCtx, stopEarly := context.WithCancel(ctx)
	defer stopEarly()
	watchSeccomp := copiesStrings(plans)
	lastLook := start
	ticker(limitCtx, o.Duration, drainPeriod, o.Progress, func(elapsed time.Duration) string {
		// A process that ended (exit, a kill) records nothing more: the
		// trace ends there, with what it recorded (its rings are in our
		// mapping), instead of waiting out --duration.
		if time.Since(lastLook) >= 50*time.Millisecond {
			lastLook = time.Now()
			drain(true) // the calls before an unload come before it in the trace
			unloaded()
			if how := s.endedAs(); how != "" {
				drain(true)
				res.Notes = append(res.Notes, fmt.Sprintf("the process %s %s into the trace; the trace ends there", how, elapsed.Round(time.Millisecond)))
				stopEarly()
				return fmt.Sprintf("%d calls", m.Calls)
			}
		}
		s.watchSeccomp()
		// A program may enter a sandbox after the capture's start (the
		// planning checked then): once any thread is under seccomp, no more
		// string copies. Calls between its filter and this look still copy
		// (docs/tracing.md); only the runtime could close that window.
		if watchSeccomp && seccompThreads(o.PID) > 0 {
			watchSeccomp = false
			s.region.DropArgStrings()
			dropStrings(plans) // records already written carry their own spec
			res.Notes = append(res.Notes, lateSeccompNote)
		}
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
	if o.Rate > 0 {
		// Seal the last epoch and wait for the hooks that took a slot
		// before the seal to write their events (D55): then the last drain
		// below has every call of the trace's epochs.
		wait := quotaWait
		if s.region.Exited() || s.gone() {
			wait = 0 // no hook of an ended process will finish
		}
		_, busy, err := s.region.EndQuotaTrace(wait)
		if err != nil {
			return nil, err
		}
		res.RateInFlight = busy
		if s.enabled != nil {
			res.QuotaHeld = quotaHeld(s, functionsOf(s), before)
			if n := QuotaHeldNote(res.QuotaHeld, o.Rate); n != "" {
				res.Notes = append(res.Notes, n)
			}
		}
		if busy > 0 {
			res.Notes = append(res.Notes, fmt.Sprintf("%d threads were inside a hook when the --rate capture ended (stopped, killed, or left by a signal handler's longjmp): their calls' events may be missing", busy))
		}
	}
	// each listed thread's CPU time while the events were on (D81): read
	// before they go off, so what a thread runs after does not count
	ran1 := map[int]time.Duration{}
	for _, tid := range o.Tids {
		if d, err := procfs.CPUTime(o.PID, tid); err == nil {
			ran1[tid] = d
		}
	}
	offErr := s.region.SetControl(0, ctl)
	// The drop counters only grow: a sum past 2^64 or one that went down
	// is not the runtime's (D92), and its difference would wrap.
	c1 := s.region.Counters()
	if len(c1.Overflow) > 0 || c1.RingDropped < dropped0 {
		if offErr == nil {
			offErr = fmt.Errorf("pid %d: %w: %w: trace_ring_full (the program wrote its own counters, or they are corrupt)", o.PID, shm.ErrUntrusted, shm.ErrOverflow)
		}
	} else {
		res.Dropped = c1.RingDropped - dropped0
	}
	drain(true) // what the rings hold is kept unless the limit was reached
	if !s.region.Exited() && !s.gone() {
		unloaded() // since the last look
	}
	for slot := range pend {
		flush(slot, false)
	}
	if res.Stale > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d events left out: their hooks decided them before this capture started (a thread inside a hook while the previous capture ended)", res.Stale))
	}
	for _, th := range s.region.Threads() {
		if th.RingDropped > slotDropped0[th.Index] {
			d := th.RingDropped - slotDropped0[th.Index]
			thread(tids[th.Index]).Dropped += d
		}
	}
	res.QuietTids = quietTids(o, perTid, ran0, ran1)
	for _, q := range res.QuietTids {
		res.Notes = append(res.Notes, q.note())
	}
	for _, t := range perTid {
		res.Threads = append(res.Threads, *t)
	}
	sort.Slice(res.Threads, func(i, j int) bool {
		a, b := res.Threads[i], res.Threads[j]
		if a.Events+a.Dropped != b.Events+b.Dropped {
			return a.Events+a.Dropped > b.Events+b.Dropped
		}
		return a.Tid < b.Tid
	})
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

// quietTids are the threads o.Tids names that recorded no event, with
// their CPU time from ran0 (read when the events went on) to ran1 (read just
// before they went off) and their state now. The kernel adds a running
// thread's time to the sum at each scheduler tick or when it leaves the
// CPU, so the figure is within a tick of the truth; 0 is exact for a thread
// that was off the CPUs throughout.
func quietTids(o Options, perTid map[int32]*ThreadDrops, ran0, ran1 map[int]time.Duration) []QuietThread {
	var out []QuietThread
	for _, tid := range o.Tids {
		if t := perTid[int32(tid)]; t != nil && t.Events+t.Dropped > 0 {
			continue
		}
		q := QuietThread{Tid: tid}
		st, err := procfs.ReadStat(o.PID, tid)
		d1, ok1 := ran1[tid]
		if err != nil || !ok1 || st.State == 'Z' || st.State == 'X' {
			q.Gone = true
		} else {
			q.State = string(st.State)
			if d0, ok := ran0[tid]; ok && d1 >= d0 {
				q.RanNs = (d1 - d0).Nanoseconds()
			} else {
				q.RanNs = -1 // not known: it did not exist at the start
			}
		}
		out = append(out, q)
	}
	return out
}

// note says why a listed thread is not in the trace, as far as procfs can.
func (q QuietThread) note() string {
	switch {
	case q.Gone:
		return fmt.Sprintf("thread %d (--tid) recorded no event: it is not a thread of the process (it ended, or never was one)", q.Tid)
	case q.RanNs == 0:
		return fmt.Sprintf("thread %d (--tid) recorded no event: it did not run during the capture (0 ns on a CPU; state %s: blocked, stopped, or left waiting by a loaded machine's scheduler)", q.Tid, q.State)
	case q.RanNs < 0:
		return fmt.Sprintf("thread %d (--tid) recorded no event: it started during the capture and made no traced call", q.Tid)
	}
	return fmt.Sprintf("thread %d (--tid) recorded no event: it ran %s on a CPU while the events were on (within a scheduler tick) and made no traced call", q.Tid, time.Duration(q.RanNs).Round(time.Microsecond))
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
	if o.MinDuration < 0 || o.MinDuration > time.Duration(math.MaxUint32) {
		return fmt.Errorf("%w: minimum duration %s (at most %s)", shm.ErrFilter, o.MinDuration, time.Duration(math.MaxUint32))
	}
	if o.MinDuration > 0 && s.region.Control()&shm.CtlNoTime != 0 {
		return fmt.Errorf("%w: a minimum duration needs the calls timed, and the process counts only (EDGEPROBE_TIMING=0)", shm.ErrFilter)
	}
	if o.MaxDepth > 0 || len(o.Tids) > 0 || o.MinDuration > 0 {
		tids := make([]int32, len(o.Tids))
		for i, t := range o.Tids {
			if t <= 0 || t > math.MaxInt32 {
				return fmt.Errorf("%w: thread id %d", shm.ErrFilter, t)
			}
			tids[i] = int32(t)
		}
		if err := s.region.SetFilter(uint32(min(o.MaxDepth, math.MaxInt32)), tids, uint32(o.MinDuration)); err != nil {
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

// monoNow is CLOCK_MONOTONIC now, the runtime's clock.
func monoNow() uint64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) != nil {
		return 0
	}
	return uint64(ts.Nano())
}
