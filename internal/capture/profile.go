package capture

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"strings"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/hotpatch"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/report"
	"github.com/edgeprobe/edgeprobe/internal/shm"
)

// ProfileOptions configure the bursty profiler.
type ProfileOptions struct {
	Options
	Samples uint64        // K: calls a function may record per epoch
	Epoch   time.Duration // E
	// HitCostNs, if positive, is the cost of one hook used to estimate the
	// slowdown; 0 means the cost the runtime measured in the target while
	// the profile ran (its hooks sampled, D31).
	HitCostNs float64
}

// ProfileResult is what a profile found and what it cost.
type ProfileResult struct {
	Functions     []report.FuncStats // calls and latency recorded during the profile
	Epochs        int
	Toggles       uint64 // site writes made to enforce the quotas
	TogglesPerSec float64
	Duration      time.Duration
	Calls         uint64        // probed calls recorded
	Hooks         uint64        // hooks that ran: entries and exits recorded, and those the quotas skipped
	TargetCPU     time.Duration // CPU time the target used meanwhile (all threads)
	HitCostNs     float64       // the cost of one hook the estimate used
	HitCostFrom   string        // where it comes from
	Slowdown      float64       // estimated: Hooks x HitCostNs / TargetCPU
	Notes         []string      // what the user should know (the process ended early)
	// QuotaHeld names the functions the profile did not select that
	// recorded calls while its quota was on: the quota is process-wide
	// (D57), so their counts over the profile are held to K per epoch too.
	QuotaHeld []string
}

// quota is one function under the profiler's control.
type quota struct {
	actions []hotpatch.Action // its selected sites, by id
	off     bool
}

// hookTotals are the runtime's per-thread hook accounting, summed.
type hookTotals struct{ ticks, samples, skips uint64 }

// hooksOf sums the slots' hook accounting; a sum past 2^64 is ErrOverflow
// (D92), never a wrapped total.
func hooksOf(r *shm.Region) (hookTotals, error) {
	var h hookTotals
	var c1, c2, c3 uint64
	for _, t := range r.Threads() {
		h.ticks, c1 = bits.Add64(h.ticks, t.HookTicks, 0)
		h.samples, c2 = bits.Add64(h.samples, t.HookSamples, 0)
		h.skips, c3 = bits.Add64(h.skips, t.QuotaSkips, 0)
		if c1|c2|c3 != 0 {
			return h, fmt.Errorf("pid %d: %w: %w: the threads' hook accounting (the program wrote its own counters, or they are corrupt)",
				r.Header().Pid, shm.ErrUntrusted, shm.ErrOverflow)
		}
	}
	return h, nil
}

// Profile runs the bursty latency profiler for o.Duration.
func Profile(ctx context.Context, o ProfileOptions) (res *ProfileResult, err error) {
	if o.Samples == 0 || o.Samples > math.MaxUint32 || o.Epoch <= 0 {
		return nil, fmt.Errorf("profile needs a sample quota of 1..%d and a positive epoch", uint32(math.MaxUint32))
	}
	sels := o.Selectors
	if len(sels) == 0 {
		all, _ := probelist.ParseSelector("*", "")
		sels = []probelist.Selector{all}
	}
	o.Selectors = nil // enabled below, once the quotas are on
	s, err := open(ctx, o.Options)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := s.close(ctx); err == nil {
			err = cerr
		}
	}()
	// The runtime enforces the quota at the hook (D31): at most K recorded
	// calls per function per epoch, exactly, however late we look. Turning
	// a full function's probes off until the next epoch only saves the
	// target the cost of its skipped calls.
	hooks0, err := hooksOf(s.region)
	if err != nil {
		return nil, err
	}
	if err := s.region.SetQuota(uint32(o.Samples)); err != nil {
		return nil, err
	}
	if _, err := s.region.NextQuotaEpoch(); err != nil {
		return nil, err
	}
	if err := s.region.SetControl(shm.CtlQuota, 0); err != nil {
		return nil, err
	}
	s.quota = true
	// Counted from here: functions already on (enabled by someone else)
	// record under the quota from now on (D57); before, they counted every
	// call. (A hook that read the control word before the quota went on
	// may still count one call after this: one per thread at most.)
	before := byAddr(s.region.Functions())
	if err := s.enable(ctx, sels); err != nil {
		return nil, err
	}
	quotas := functionsOf(s)
	cpu0, err := cpuTime(o.PID)
	if err != nil {
		return nil, err
	}
	res = &ProfileResult{}
	start := time.Now()
	epochStart := time.Time{}
	epoch := s.region.QuotaEpoch()
	// Twenty looks per epoch, but at least ten a second: the quota is
	// enforced between looks, so a long epoch must not mean a late one.
	poll := min(max(o.Epoch/20, time.Millisecond), 100*time.Millisecond)
	var loopErr error
	// A process that ends (exit, a kill) records nothing more: the profile
	// ends there with what it recorded, instead of waiting out --duration
	// and failing on the next toggle.
	limitCtx, stopEarly := context.WithCancel(ctx)
	defer stopEarly()
	ended, endedHow := false, "ended"
	lastLook := start
	cpuLast := cpu0
	toggle := func(q []*quota, on bool) {
		var actions []hotpatch.Action
		for _, x := range q {
			for _, a := range x.actions {
				a.Enable = on
				actions = append(actions, a)
			}
			x.off = !on
		}
		if len(actions) == 0 || loopErr != nil || ended {
			return
		}
		r, err := s.hp.Apply(ctx, actions, hotpatch.ProtoAuto, 0)
		if r != nil {
			res.Toggles += uint64(r.Changed)
		}
		if err != nil && hotpatch.Gone(err) {
			// The write found the process's memory gone: it is ending,
			// whether or not /proc shows it yet.
			if how := s.endedAs(); how != "" {
				endedHow = how
			}
			ended = true
			return
		}
		if err != nil && errors.Is(err, hotpatch.ErrUnmapped) {
			// An object the profile has probes in was unloaded (or
			// replaced): nothing of it can be toggled any more (D77). What
			// was recorded until then is the profile's.
			ended, endedHow = true, "unloaded an object the profile had probes in"
			return
		}
		if err != nil && ctx.Err() == nil {
			loopErr = err
		}
	}
	ticker(limitCtx, o.Duration, poll, o.Progress, func(elapsed time.Duration) string {
		if !ended && time.Since(lastLook) >= 50*time.Millisecond {
			lastLook = time.Now()
			if how := s.endedAs(); how != "" {
				ended, endedHow = true, how
			} else if s.unloadedEnabled() {
				// An object the profile has probes in unloaded while none
				// of its functions was due a toggle (their quotas not used
				// up): no toggle would ever find it (D80).
				ended, endedHow = true, "unloaded an object the profile had probes in"
			} else if c, err := cpuTime(o.PID); err == nil {
				cpuLast = c
			}
		}
		if ended {
			res.Notes = append(res.Notes, fmt.Sprintf("the process %s %s into the profile; the profile ends there", endedHow, elapsed.Round(time.Millisecond)))
			stopEarly()
			return fmt.Sprintf("epoch %d, %d site toggles", res.Epochs, res.Toggles)
		}
		s.watchSeccomp()
		if epochStart.IsZero() || time.Since(epochStart) >= o.Epoch {
			if !epochStart.IsZero() {
				e, err := s.region.NextQuotaEpoch()
				if err != nil && loopErr == nil {
					loopErr = err
				}
				epoch = e
			}
			epochStart = time.Now()
			res.Epochs++
			var back []*quota
			for _, q := range quotas {
				if q.off {
					back = append(back, q)
				}
			}
			toggle(back, true)
		}
		var full []*quota
		for addr, q := range quotas {
			if e, used, ok := s.region.QuotaUsed(addr); ok && !q.off && e == epoch && uint64(used) >= o.Samples {
				full = append(full, q)
			}
		}
		toggle(full, false)
		return fmt.Sprintf("epoch %d, %d site toggles", res.Epochs, res.Toggles)
	})
	if loopErr != nil {
		return nil, loopErr
	}
	res.Duration = time.Since(start)
	cpu1, err := cpuTime(o.PID)
	if ended || err != nil && s.gone() {
		cpu1, err = cpuLast, nil // the CPU it used until its last look
	}
	if err != nil {
		return nil, err
	}
	res.TargetCPU = cpu1 - cpu0
	res.QuotaHeld = quotaHeld(s, quotas, before)
	delta := deltas(s.region.Functions(), before)
	if err := report.CheckSums(delta, s.sym); err != nil {
		return nil, fmt.Errorf("pid %d: %w", o.PID, err)
	}
	res.Functions = report.Rows(delta, s.sym)
	hooks1, err := hooksOf(s.region)
	if err != nil {
		return nil, err
	}
	// Growth only (D92): a count that went down, or totals past 2^64, are
	// not the runtime's.
	var cs [5]uint64
	res.Hooks, cs[0] = bits.Sub64(hooks1.skips, hooks0.skips, 0)
	for _, f := range delta {
		res.Calls, cs[1] = bits.Add64(res.Calls, f.Entries, cs[1])
		res.Hooks, cs[2] = bits.Add64(res.Hooks, f.Entries, cs[2])
		res.Hooks, cs[3] = bits.Add64(res.Hooks, f.Exits, cs[3])
	}
	_, cs[4] = bits.Sub64(hooks1.samples, hooks0.samples, 0)
	if _, c := bits.Sub64(hooks1.ticks, hooks0.ticks, 0); cs[0]|cs[1]|cs[2]|cs[3]|cs[4]|c != 0 {
		return nil, fmt.Errorf("pid %d: %w: %w: the profile's totals (the program wrote its own counters, or they are corrupt)",
			o.PID, shm.ErrUntrusted, shm.ErrOverflow)
	}
	if res.Duration > 0 {
		res.TogglesPerSec = float64(res.Toggles) / res.Duration.Seconds()
	}
	res.HitCostNs, res.HitCostFrom = o.HitCostNs, "--hit-cost"
	if o.HitCostNs <= 0 {
		res.HitCostNs, res.HitCostFrom = 0, "not measured (no hook sampled: no TSC, or no probed call)"
		if n := hooks1.samples - hooks0.samples; n > 0 {
			res.HitCostNs = s.region.TicksToNs(hooks1.ticks-hooks0.ticks) / float64(n)
			res.HitCostFrom = fmt.Sprintf("measured in the target: %d hooks sampled", n)
		}
	}
	if res.TargetCPU > 0 {
		res.Slowdown = float64(res.Hooks) * res.HitCostNs / float64(res.TargetCPU.Nanoseconds())
	}
	return res, nil
}

// functionsOf groups the enabled sites by the function they report, keyed
// by its run-time address (what the runtime records). Sites whose function
// was not recovered cannot be attributed and stay on for the whole profile.
// unloadedEnabled reports whether an object the capture turned probes on
// in is no longer mapped where it was (hotpatch.Session.Unmapped).
func (s *session) unloadedEnabled() bool {
	if s.enabled == nil {
		return false
	}
	gone := s.hp.Unmapped()
	for _, r := range s.enabled.Sites {
		for _, g := range gone {
			if r.Object == g {
				return true
			}
		}
	}
	return false
}

func functionsOf(s *session) map[uint64]*quota {
	qs := map[uint64]*quota{}
	if s.enabled == nil {
		return qs
	}
	targets := map[string]*hotpatch.Target{}
	for _, t := range s.hp.Targets() {
		targets[t.Object.Path] = t
	}
	for _, r := range s.enabled.Sites {
		p, err := targets[r.Object].Probe(r.ID)
		if err != nil || !p.Resolved || p.FunctionAddress == 0 { // enabled, so decoded before: no error
			continue
		}
		addr := targets[r.Object].Object.Runtime(uint64(p.FunctionAddress))
		q := qs[addr]
		if q == nil {
			q = &quota{}
			qs[addr] = q
		}
		sel, _ := probelist.ParseSelector(fmt.Sprintf("id:%d", p.ID), "")
		q.actions = append(q.actions, hotpatch.Action{Selector: sel, Object: r.Object})
	}
	return qs
}

// quotaHeld names the functions outside mine (the capture's selection)
// that recorded calls since before, while the capture's quota was on (D57:
// the quota is one process-wide switch, so they were held to it as well).
func quotaHeld(s *session, mine map[uint64]*quota, before map[uint64]shm.Func) []string {
	var out []string
	for _, f := range s.region.Functions() {
		if mine[f.Addr] != nil || f.Entries <= before[f.Addr].Entries {
			continue
		}
		name, _ := s.sym.Name(f.Addr, !f.Bare)
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// QuotaHeldNote says what quotaHeld found, "" for nothing.
func QuotaHeldNote(held []string, k uint64) string {
	if len(held) == 0 {
		return ""
	}
	names := held
	if len(names) > 5 {
		names = append(append([]string{}, names[:5]...), fmt.Sprintf("and %d more", len(held)-5))
	}
	return fmt.Sprintf("the quota is process-wide (D57): %d functions this capture did not select recorded calls meanwhile and were held to %d per epoch as well, so their counts over the capture are not their calls: %s",
		len(held), k, strings.Join(names, ", "))
}

func byAddr(fs []shm.Func) map[uint64]shm.Func {
	m := make(map[uint64]shm.Func, len(fs))
	for _, f := range fs {
		m[f.Addr] = f
	}
	return m
}

// deltas returns what each function recorded since before. Min and max are
// the lifetime values (they cannot be subtracted); percentiles come from the
// histogram's difference, clamped to them.
func deltas(now []shm.Func, before map[uint64]shm.Func) []shm.Func {
	var out []shm.Func
	for _, f := range now {
		b := before[f.Addr]
		d := f
		d.Overflow = append([]string(nil), f.Overflow...)
		// The counters only grow: one that went down was not written by
		// the runtime, and its difference would wrap (D92).
		down := func(cur, prev *uint64, what string) {
			if *cur < *prev {
				d.Overflow = append(d.Overflow, what+" went down")
				*cur = 0
				return
			}
			*cur -= *prev
		}
		down(&d.Entries, &b.Entries, "entries")
		down(&d.Exits, &b.Exits, "exits")
		down(&d.Orphans, &b.Orphans, "orphan_exits")
		down(&d.Unmatched, &b.Unmatched, "unmatched_entries")
		down(&d.Samples, &b.Samples, "samples")
		down(&d.SumNs, &b.SumNs, "total_ns")
		for i := range d.Hist {
			down(&d.Hist[i], &b.Hist[i], fmt.Sprintf("histogram bucket %d", i))
		}
		if d.Entries == 0 && d.Exits == 0 && len(d.Overflow) == 0 {
			continue
		}
		out = append(out, d)
	}
	return out
}

// cpuTime is the user+system time of every thread of pid so far.
func cpuTime(pid int) (time.Duration, error) {
	st, err := procfs.ReadStat(pid, 0)
	if err != nil {
		return 0, err
	}
	return time.Duration(st.Utime+st.Stime) * (time.Second / clockTicks), nil
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat times: 100 on every
// Linux x86-64 ABI.
const clockTicks = 100
