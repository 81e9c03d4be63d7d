package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/ptrace"
)

func rateName(r int) string {
	switch {
	case r == 0:
		return "max"
	case r%1000 == 0:
		return fmt.Sprintf("%dk", r/1000)
	default:
		return fmt.Sprint(r)
	}
}

// RunThroughput is row 3 (the paper's Figure 12): executor threads call the
// probed function while the harness toggles its entry probe at fixed rates.
func (h *Harness) RunThroughput(ctx context.Context) error {
	r, err := h.startThroughput(ctx)
	if err != nil {
		return err
	}
	defer r.close()
	m, err := r.measure(ctx)
	if err != nil {
		return err
	}
	if _, err := r.t.Quit(ctx); err != nil {
		return err
	}
	h.reportThroughput(m)
	return nil
}

// throughputRun is the running toggle target and the flip that toggles it.
type throughputRun struct {
	h   *Harness
	t   *Target
	mem *ptrace.Mem
	set func(on bool) error
	// async, when set, is what the paced toggler calls (set waits for the
	// toggle to be done; async only sends n alternating toggles, the first
	// turning the probes on if on: row 7's session); completed counts the
	// toggles async sent that are done (their results came back), which
	// is what the achieved rate counts.
	async     func(on bool, n int) error
	completed func() int64
	// toggler, when set, is the toggling process's CPU time so far (ns):
	// the session's share of a CPU in each window is reported with it.
	toggler func() int64
	// sub is one measured window's length (measure: Window / cycles).
	sub time.Duration
}

func (h *Harness) startThroughput(ctx context.Context) (*throughputRun, error) {
	flipBin, _, flipList, _, err := h.toggleBuilds()
	if err != nil {
		return nil, err
	}
	t, err := h.startToggle(ctx, flipBin, h.Cfg.Executors)
	if err != nil {
		return nil, err
	}
	sites, err := Sites(t.Pid, flipList, "probed", "")
	if err != nil {
		t.Kill()
		return nil, err
	}
	mem, err := ptrace.OpenMem(t.Pid)
	if err != nil {
		t.Kill()
		return nil, err
	}
	r := &throughputRun{h: h, t: t, mem: mem, set: flipper(ctx, mem, sites)}
	if err := checkLive(ctx, t, r.set); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *throughputRun) close() {
	if r.mem != nil {
		r.mem.Close()
	}
	r.t.Kill()
}

// win is one window's calls, hook entries, executor CPU time (s), wall
// time (s) and context switches of the executors; toggler: the toggling
// process's CPU time (s) when throughputRun.toggler is set.
type win struct{ calls, enters, cpu, wall, vol, invol, toggler float64 }

// window measures one window.
func (r *throughputRun) window(ctx context.Context) (win, error) {
	v0, i0 := ctxSwitches(r.t.Pid)
	a, err := r.t.Counts(ctx)
	if err != nil {
		return win{}, err
	}
	t0 := time.Now()
	time.Sleep(r.length())
	b, err := r.t.Counts(ctx)
	if err != nil {
		return win{}, err
	}
	// Executors that got no CPU at all in the window (other load on their
	// core) measured nothing: the window goes on, a window's length at a time, until
	// they have run (stallLimit at most). The rates below are per executor
	// CPU-second and per wall second of the whole window, and a toggled
	// window in which they ran less than half the time is still set aside
	// as starved (measure).
	for deadline := t0.Add(stallLimit); (b.CPUNs <= a.CPUNs || b.Calls == a.Calls) && time.Now().Before(deadline); {
		time.Sleep(r.length())
		if b, err = r.t.Counts(ctx); err != nil {
			return win{}, err
		}
	}
	v1, i1 := ctxSwitches(r.t.Pid)
	w := win{calls: float64(b.Calls - a.Calls), enters: float64(b.Enters - a.Enters),
		cpu: float64(b.CPUNs-a.CPUNs) / 1e9, wall: time.Since(t0).Seconds(), vol: float64(v1 - v0), invol: float64(i1 - i0)}
	if w.cpu <= 0 || w.calls == 0 {
		return w, errNoProgress
	}
	return w, nil
}

// toggled runs a toggler at rate (0: flat out) during one window.
func (r *throughputRun) toggled(ctx context.Context, rate int) (w win, achieved float64, err error) {
	var stop atomic.Bool
	var n int64
	done := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		unpin := r.h.pinHarness()
		defer unpin()
		close(started)
		if r.async != nil {
			done <- r.burst(rate, &stop, &n)
			return
		}
		period := time.Duration(0)
		if rate > 0 {
			period = time.Second / time.Duration(rate)
		}
		next := time.Now()
		v := false
		toggle := r.set
		for !stop.Load() {
			if period > 0 {
				for time.Now().Before(next) {
				}
				next = next.Add(period)
				if now := time.Now(); now.Sub(next) > period {
					next = now // fell behind: no catch-up burst
				}
			}
			if err := toggle(v); err != nil {
				done <- err
				return
			}
			v = !v
			atomic.AddInt64(&n, 1)
		}
		done <- r.set(true)
	}()
	<-started
	time.Sleep(r.length() / 10)
	count := func() int64 { return atomic.LoadInt64(&n) }
	if r.completed != nil {
		count = r.completed // sent is not done: count the results
	}
	var c0 int64
	if r.toggler != nil {
		c0 = r.toggler()
	}
	n0, t0 := count(), time.Now()
	w, err = r.window(ctx)
	if err == errNoProgress {
		err = nil // counted as a starved round below
	}
	achieved = float64(count()-n0) / time.Since(t0).Seconds()
	if r.toggler != nil {
		w.toggler = float64(r.toggler()-c0) / 1e9
	}
	stop.Store(true)
	if terr := <-done; err == nil {
		err = terr
	}
	return
}

// burstTick is how often the session's toggler sends its lines.
const burstTick = time.Millisecond

// maxCatchUp is how many ticks' worth of lines one write may carry when
// the toggler woke late (the session shares its CPU, so a wake-up can wait
// for the session's batch); beyond it the backlog is dropped.
const maxCatchUp = 10

// burst is the paced toggler for a session (async): each burstTick it sends
// in one write the lines the rate asks for by then (rate x time since it
// started, less what it sent) and sleeps, instead of spinning until each
// toggle is due as the synchronous toggler does: a spinning harness would
// take the very core the session runs on (the harness's), and what is
// measured is the target's slowdown, not the harness's. A late wake-up is
// made up in the next write, maxCatchUp ticks' worth at most (a longer
// stall is not caught up in one burst). The session reads whatever is waiting as
// one batch either way. Rate 0: as fast as the pipe takes them.
func (r *throughputRun) burst(rate int, stop *atomic.Bool, n *int64) error {
	start := time.Now()
	var sent int64
	v := false
	for tick := 1; !stop.Load(); tick++ {
		per := int64(1000)
		if rate > 0 {
			due := int64(rate) * int64(time.Since(start)) / int64(time.Second)
			per = min(due-sent, maxCatchUp*int64(rate)*int64(burstTick)/int64(time.Second))
			if due-sent > per {
				sent = due - per // the rest is dropped, not caught up
			}
		}
		if per > 0 {
			if err := r.async(v, int(per)); err != nil {
				return err
			}
			if per%2 == 1 {
				v = !v
			}
			sent += per
			atomic.AddInt64(n, per)
		}
		if rate > 0 {
			if d := time.Until(start.Add(time.Duration(tick) * burstTick)); d > 0 {
				time.Sleep(d)
			} else if -d > burstTick {
				tick = int(time.Since(start) / burstTick) // fell behind: restart the ticks from now
			}
		}
	}
	return r.set(true)
}

// rateCell is what the rounds measured at one toggle rate.
type rateCell struct {
	calls, enters, achieved, ratio, wallRatio, share, vol, invol []float64
	toggler                                                      []float64 // the toggling process's share of a CPU
	starved                                                      int
}

// throughputSamples are every round's figures: the steady rates (calls per
// executor CPU-second and per wall second) with the probe enabled and
// disabled, and each toggle rate's cell.
type throughputSamples struct {
	act, inert, actWall, inertWall []float64
	cells                          map[int]*rateCell
}

func (m *throughputSamples) cell(rate int) *rateCell {
	c := m.cells[rate]
	if c == nil {
		c = &rateCell{}
		m.cells[rate] = c
	}
	return c
}

// cycles is how many cycles of the three sub-windows (steady enabled,
// steady disabled, toggled) measure one toggle rate in a round; each
// sub-window is Window/cycles long, so every state still gets a Window of
// calls per round and rate.
const cycles = 4

// measure runs Reps rounds. In each, every toggle rate gets its own
// baselines, interleaved with it: cycles cycles of three sub-windows, the
// probe steadily enabled, steadily disabled and toggled at the rate, the
// odd cycles in the reverse order. The machine's speed drifts by several
// percent over seconds (D91): a ratio against baselines measured seconds
// before or after its toggled window carries that drift, and sub-windows
// this close, in mirrored order, share it. A round's ratio for the rate
// pools its cycles (calls, hook entries, CPU and wall time summed per
// state).
func (r *throughputRun) measure(ctx context.Context) (*throughputSamples, error) {
	cfg := r.h.Cfg
	m := &throughputSamples{cells: map[int]*rateCell{}}
	r.sub = cfg.Window / cycles
	// A window in which the executors ran less than half the time (other
	// load on their core) says nothing about the cost of a toggle: a
	// starved baseline would make its toggled window look faster than
	// untoggled, a starved toggled window slower. Such a round is counted
	// for its rate and set aside.
	starved := func(w win) bool { return w.cpu < 0.5*w.wall*float64(cfg.Executors) }
	for rep := 0; rep < cfg.Reps; rep++ {
		for _, rate := range cfg.Rates {
			a, i, t, ach, err := r.cycle(ctx, rate)
			if err != nil {
				return nil, err
			}
			if t.enters > t.calls*1.01+1000 {
				return nil, fmt.Errorf("toggling at %s/s: %.0f calls but %.0f hook entries", rateName(rate), t.calls, t.enters)
			}
			cl := m.cell(rate)
			if starved(a) || starved(i) || starved(t) {
				r.h.logf("round %d at %s/s (achieved %.3g/s): executors on CPU %.0f%% / %.0f%% / %.0f%% (enabled / disabled / toggled; %.0f voluntary / %.0f involuntary switches toggled): set aside as starved",
					rep, rateName(rate), ach, 100*a.cpu/a.wall/float64(cfg.Executors), 100*i.cpu/i.wall/float64(cfg.Executors),
					100*t.cpu/t.wall/float64(cfg.Executors), t.vol, t.invol)
				cl.starved++
				continue
			}
			ra, ri := a.calls/a.cpu, i.calls/i.cpu // calls per executor CPU-second
			ra0, ri0 := a.calls/a.wall, i.calls/i.wall
			m.act, m.inert = append(m.act, ra), append(m.inert, ri)
			m.actWall, m.inertWall = append(m.actWall, ra0), append(m.inertWall, ri0)
			// The CPU time these calls would take without toggling: the
			// enabled ones at the steady enabled rate, the rest at the
			// steady disabled rate.
			ideal := t.enters/ra + (t.calls-t.enters)/ri
			idealWall := t.enters/ra0 + (t.calls-t.enters)/ri0
			cl.calls = append(cl.calls, t.calls/t.wall)
			cl.enters = append(cl.enters, t.enters/t.wall)
			cl.achieved = append(cl.achieved, ach)
			cl.ratio = append(cl.ratio, ideal/t.cpu)
			cl.wallRatio = append(cl.wallRatio, idealWall/t.wall)
			cl.vol, cl.invol = append(cl.vol, t.vol/t.wall), append(cl.invol, t.invol/t.wall)
			cl.share = append(cl.share, t.cpu/t.wall/float64(cfg.Executors))
			cl.toggler = append(cl.toggler, t.toggler/t.wall)
		}
	}
	return m, nil
}

// cycle measures one rate's cycles and returns the pooled enabled,
// disabled and toggled sub-windows and the achieved toggle rate (toggles
// over the toggled sub-windows' wall time).
func (r *throughputRun) cycle(ctx context.Context, rate int) (a, i, t win, achieved float64, err error) {
	var toggles float64
	for c := 0; c < cycles; c++ {
		order := []int{0, 1, 2}
		if c%2 == 1 {
			order = []int{2, 1, 0}
		}
		for _, k := range order {
			var w win
			switch k {
			case 0, 1:
				if err = r.set(k == 0); err != nil {
					return
				}
				if w, err = r.window(ctx); err == errNoProgress {
					err = nil // a starved sub-window: the pooled window says so
				}
				if k == 0 {
					a.add(w)
				} else {
					i.add(w)
				}
			case 2:
				var ach float64
				if w, ach, err = r.toggled(ctx, rate); err != nil {
					err = fmt.Errorf("toggling at %s/s: %w", rateName(rate), err)
					return
				}
				toggles += ach * w.wall
				t.add(w)
			}
			if err != nil {
				return
			}
		}
	}
	if t.wall > 0 {
		achieved = toggles / t.wall
	}
	return
}

// length is one measured window's: sub inside measure, else Window.
func (r *throughputRun) length() time.Duration {
	if r.sub > 0 {
		return r.sub
	}
	return r.h.Cfg.Window
}

func (w *win) add(x win) {
	w.calls += x.calls
	w.enters += x.enters
	w.cpu += x.cpu
	w.wall += x.wall
	w.vol += x.vol
	w.invol += x.invol
	w.toggler += x.toggler
}

func (h *Harness) reportThroughput(m *throughputSamples) {
	med := func(s []float64) float64 { return Summarize(s, h.TSC).MedianNs }
	sec := Section{Title: "3. Throughput under toggling (Chamith et al., Figure 12)",
		Text: fmt.Sprintf("bench/toggle.c (flip placeholder), %d executor thread(s) pinned to CPU 1 calling `probed()` with counting hooks; the harness, pinned to CPU 0, flips the function's entry and exit probes (one xmod.Flip call per toggle). %d rounds; in each, every rate is measured against baselines of its own, interleaved with it: %d cycles of three %v windows (probe steadily enabled, steadily disabled, toggled at the rate), every other cycle in the reverse order, pooled per state (D91). "+
			"Ratio = the time those calls would have taken without toggling (the calls that ran the hook at the steady enabled rate, the rest at the steady disabled rate, both measured in the same cycles) / the time they took: 1.0 means toggling cost nothing, and the observed on/off mix takes the duty cycle out of the figure. "+
			"`ratio (wall)` uses wall-clock time (the paper's throughput; the JSON's throughput_ratio); `ratio (CPU)` uses the executors' CPU time (pthread_getcpuclockid), which leaves out time an executor spent off its CPU, whether other load took it or the toggling did. The context-switch rates show which.",
			h.Cfg.Executors, h.Cfg.Reps, cycles, h.Cfg.Window/cycles),
		Head: []string{"toggle rate", "achieved toggles/s", "calls/s (wall)", "hook entries/s", "executor on CPU", "voluntary / involuntary switches/s", "ratio (wall)", "ratio (CPU)"}}
	sec.Rows = append(sec.Rows, []string{"none, probe enabled", "0", fmt.Sprintf("%.3g", med(m.actWall)), "", "", "", "", fmt.Sprintf("%.3g calls per CPU-s", med(m.act))},
		[]string{"none, probe disabled", "0", fmt.Sprintf("%.3g", med(m.inertWall)), "", "", "", "", fmt.Sprintf("%.3g calls per CPU-s", med(m.inert))})
	h.Rep.Set("throughput_detail.enabled_calls_per_cpu_s", med(m.act))
	h.Rep.Set("throughput_detail.disabled_calls_per_cpu_s", med(m.inert))
	for _, r := range h.Cfg.Rates {
		cl := m.cell(r)
		if len(cl.ratio) == 0 {
			h.Rep.Skip("throughput_ratio."+rateName(r), fmt.Sprintf("in all %d rounds the executors were on their CPU less than half the window: no usable measurement", cl.starved))
			sec.Rows = append(sec.Rows, []string{rateName(r) + "/s", "", "", "", "", "", "not measured: executors starved in every round", ""})
			continue
		}
		if cl.starved > 0 {
			h.Rep.Set("throughput_detail.starved_rounds."+rateName(r), float64(cl.starved))
		}
		rs := Summarize(cl.ratio, h.TSC)
		ws := Summarize(cl.wallRatio, h.TSC)
		name := rateName(r)
		h.Rep.Set("throughput_ratio."+name, ws.MedianNs)
		h.Rep.Set("throughput_detail.cpu_ratio."+name, rs.MedianNs)
		h.Rep.Set("throughput_detail.calls_per_s."+name, med(cl.calls))
		h.Rep.Set("throughput_detail.achieved_toggles_per_s."+name, med(cl.achieved))
		label := name + "/s"
		if r == 0 {
			label = "as fast as possible"
		}
		if cl.starved > 0 {
			label += fmt.Sprintf(" (%d of %d rounds dropped: executors on CPU < 50%% of the window)", cl.starved, cl.starved+len(cl.ratio))
		}
		sec.Rows = append(sec.Rows, []string{label, fmt.Sprintf("%.3g", med(cl.achieved)), fmt.Sprintf("%.3g", med(cl.calls)),
			fmt.Sprintf("%.3g", med(cl.enters)), fmt.Sprintf("%.0f%%", 100*med(cl.share)), fmt.Sprintf("%.3g / %.3g", med(cl.vol), med(cl.invol)),
			fmt.Sprintf("%.3f (%.3f-%.3f)", ws.MedianNs, ws.P10Ns, ws.P90Ns), fmt.Sprintf("%.3f (%.3f-%.3f)", rs.MedianNs, rs.P10Ns, rs.P90Ns)})
	}
	sec.Foot = "Paper: throughput unaffected through 100k toggles/s (callpatch), degrading towards 1M/s. Here each toggle is a pwrite to /proc/PID/mem from another process; the executor's core sees a cross-modified line every toggle."
	h.Rep.Add(sec)
}

// ctxSwitches sums the voluntary and involuntary context switches of every
// thread of pid but its main thread (the executors).
func ctxSwitches(pid int) (vol, invol uint64) {
	dirs, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	for _, d := range dirs {
		if filepath.Base(d) == strconv.Itoa(pid) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "status"))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) != 2 {
				continue
			}
			v, _ := strconv.ParseUint(f[1], 10, 64)
			switch f[0] {
			case "voluntary_ctxt_switches:":
				vol += v
			case "nonvoluntary_ctxt_switches:":
				invol += v
			}
		}
	}
	return
}
