package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// toggleBuilds builds bench/toggle.c and its flip and nop cold copies.
func (h *Harness) toggleBuilds() (flip, nop string, flipList, nopList *probelist.List, err error) {
	bin, err := h.B.Build("toggle-instr", "gcc", []string{"-O2", "-g", "-pthread", "-finstrument-functions"}, "bench/toggle.c", "bench/counthooks.c")
	if err != nil {
		return
	}
	if flip, flipList, err = h.B.Cold(bin, "toggle-flip", probelist.PlaceholderFlip); err != nil {
		return
	}
	nop, nopList, err = h.B.Cold(bin, "toggle-nop", probelist.PlaceholderNop)
	return
}

func (h *Harness) startToggle(ctx context.Context, bin string, executors int) (*Target, error) {
	return Start(ctx, nil, bin, strconv.Itoa(executors), strconv.Itoa(h.targetCPU()))
}

type toggleFn func(ctx context.Context, on bool) (time.Duration, error)

// measureToggles alternates deactivation and activation of one site reps
// times (after a warm-up) and returns both directions' samples in ns.
func measureToggles(ctx context.Context, reps, warm int, fn toggleFn) (act, deact []float64, err error) {
	for i := 0; i < warm; i++ {
		if _, err = fn(ctx, false); err != nil {
			return
		}
		if _, err = fn(ctx, true); err != nil {
			return
		}
	}
	for i := 0; i < reps; i++ {
		d, e := fn(ctx, false)
		if e != nil {
			return nil, nil, e
		}
		deact = append(deact, float64(d.Nanoseconds()))
		a, e := fn(ctx, true)
		if e != nil {
			return nil, nil, e
		}
		act = append(act, float64(a.Nanoseconds()))
	}
	return
}

// RunToggle is row 1's activation/deactivation: one probe (probed()'s entry
// site), toggled from this process in a running toggle target whose executor
// keeps calling it.
func (h *Harness) RunToggle(ctx context.Context) error {
	flipBin, nopBin, flipList, nopList, err := h.toggleBuilds()
	if err != nil {
		return err
	}
	sec := h.toggleSection()
	defer func() { h.Rep.Add(*sec) }()
	flip, err := h.measureFlipToggles(ctx, flipBin, flipList)
	if err != nil {
		return err
	}
	h.reportFlipToggles(sec, flip, flipList)
	traced, err := h.measureTracedToggles(ctx, nopBin, nopList)
	h.reportTracedToggles(sec, traced, nopList) // the protocols measured before an error
	if err != nil {
		return err
	}
	sec.Foot = "Paper (Chamith et al., Table 2, TSC ticks, on a 2012-era Xeon): fastinst sync non-straddlers 300 / 120 / 35 (activation / deactivation / invocation), straddlers 8850 / 8435 / 35, callpatch 432 / 315 / 35; Dyninst 1,929,244 / 995,447 / 320; DTrace ~70,771 / - / 1176. Their toggles are in-process calls; ours cross a process boundary (a pwrite to /proc/PID/mem, or ptrace), so the floor is a system call."
	return nil
}

func (h *Harness) toggleSection() *Section {
	return &Section{Title: "1. Probe activation and deactivation (Table 2 shape)",
		Text: fmt.Sprintf("One probe (the entry site of `probed()` in bench/toggle.c), toggled from the Go harness in a separate C process while %d executor thread(s) call it in a loop (harness pinned to CPU 0, executors to CPU 1). "+
			"`flip` and its target use the flip placeholder; `int3`, `int3-async` and `stop` use a nop-placeholder copy (the multi-byte case they exist for), with the tracer attached once beforehand. int3 wait: %s. "+
			"For int3-async the toggle figure is the caller's `Start` (the wait is pushed off the calling thread, as in the paper); the time until the patch is complete is listed beside it. %d toggles per direction (int3-async/stop: %d) after a warm-up.",
			h.Cfg.Executors, h.waitText(), h.Cfg.ToggleReps, h.Cfg.AsyncReps),
		Head: []string{"protocol", "activation", "deactivation", "toggle (both)", "note"}}
}

// togglePair is one protocol's samples, ns.
type togglePair struct{ act, deact []float64 }

// addToggleRow reports one protocol's row and its toggle.* figures.
func (h *Harness) addToggleRow(sec *Section, key, name string, p togglePair, note string) {
	a, d := Summarize(p.act, h.TSC), Summarize(p.deact, h.TSC)
	both := Summarize(append(append([]float64(nil), p.act...), p.deact...), h.TSC)
	h.Rep.Stats["toggle_detail."+key+".activation"] = a
	h.Rep.Stats["toggle_detail."+key+".deactivation"] = d
	h.Rep.SetStat("toggle."+key, both)
	sec.Rows = append(sec.Rows, []string{name, Cell(a), Cell(d), Cell(both), note})
}

// flipToggles are the flip protocol's samples and, for reference, the bare
// 1-byte pwrite the flip is made of.
type flipToggles struct {
	togglePair
	pwrite []float64
}

// measureFlipToggles toggles the flip target through a plain
// /proc/PID/mem, no tracer.
func (h *Harness) measureFlipToggles(ctx context.Context, bin string, list *probelist.List) (*flipToggles, error) {
	t, err := h.startToggle(ctx, bin, h.Cfg.Executors)
	if err != nil {
		return nil, err
	}
	defer t.Kill()
	sites, err := Sites(t.Pid, list, "probed", probelist.KindEntry)
	if err != nil {
		return nil, err
	}
	mem, err := ptrace.OpenMem(t.Pid)
	if err != nil {
		return nil, err
	}
	defer mem.Close()
	set := flipper(ctx, mem, sites)
	if err := checkLive(ctx, t, set); err != nil {
		return nil, fmt.Errorf("flip target: %w", err)
	}
	one := sites[0].Inert[:1]
	unpin := h.pinHarness()
	var r flipToggles
	for i := 0; i < h.Cfg.ToggleReps; i++ {
		t0 := time.Now()
		if err := mem.WriteMem(sites[0].Addr, one); err != nil {
			unpin()
			return nil, err
		}
		r.pwrite = append(r.pwrite, float64(time.Since(t0).Nanoseconds()))
	}
	r.act, r.deact, err = measureToggles(ctx, h.Cfg.ToggleReps, 100, func(ctx context.Context, v bool) (time.Duration, error) {
		t0 := time.Now()
		err := set(v)
		return time.Since(t0), err
	})
	unpin()
	if err != nil {
		return nil, fmt.Errorf("flip: %w", err)
	}
	if _, err := t.Quit(ctx); err != nil {
		return nil, err
	}
	return &r, nil
}

func (h *Harness) reportFlipToggles(sec *Section, r *flipToggles, list *probelist.List) {
	pw := Summarize(r.pwrite, h.TSC)
	h.Rep.SetStat("toggle_detail.pwrite_1byte", pw)
	p, _ := probeOf(list, "probed", probelist.KindEntry)
	h.addToggleRow(sec, "flip", "flip", r.togglePair, fmt.Sprintf("site %s, straddle %q; a bare 1-byte pwrite: %s", p.Encoding, p.Straddle, Cell(pw)))
}

// tracedToggles are the samples of the protocols that need the tracer; a
// nil pair was not measured (an earlier one failed).
type tracedToggles struct {
	int3, async, stop *togglePair
	// int3-async's figure is Start; these are until complete, and Start
	// plus every Finish call.
	asyncComplete, asyncWork []float64
}

// measureTracedToggles runs int3, int3-async and stop on the
// nop-placeholder target, the tracer attached once; it returns what it
// measured before any error.
func (h *Harness) measureTracedToggles(ctx context.Context, bin string, list *probelist.List) (*tracedToggles, error) {
	r := &tracedToggles{}
	t, err := h.startToggle(ctx, bin, h.Cfg.Executors)
	if err != nil {
		return r, err
	}
	defer t.Kill()
	sites, err := Sites(t.Pid, list, "probed", probelist.KindEntry)
	if err != nil {
		return r, err
	}
	tr, err := ptrace.Attach(t.Pid, ptrace.Options{})
	if err != nil {
		return r, fmt.Errorf("attach: %w", err)
	}
	defer tr.Detach()
	on, off := changes(sites, true), changes(sites, false)
	pick := func(v bool) []xmod.Change {
		if v {
			return on
		}
		return off
	}
	opts := xmod.Int3Options{Wait: h.Cfg.Int3Wait}
	int3 := func(ctx context.Context, v bool) (time.Duration, error) {
		t0 := time.Now()
		_, err := xmod.Int3(ctx, tr, pick(v), opts)
		return time.Since(t0), err
	}
	if err := checkLive(ctx, t, func(v bool) error { _, err := int3(ctx, v); return err }); err != nil {
		return r, fmt.Errorf("int3 target: %w", err)
	}
	var p togglePair
	if p.act, p.deact, err = measureToggles(ctx, h.Cfg.ToggleReps, 5, int3); err != nil {
		return r, fmt.Errorf("int3: %w", err)
	}
	r.int3 = &p

	async := xmod.NewAsync(tr, opts)
	asyncFn := func(ctx context.Context, v bool) (time.Duration, error) {
		t0 := time.Now()
		if _, err := async.Start(ctx, pick(v)); err != nil {
			return 0, err
		}
		started := time.Since(t0)
		var busy time.Duration
		for {
			f0 := time.Now()
			n, err := async.Finish(ctx)
			busy += time.Since(f0)
			if err != nil {
				return 0, err
			}
			if n == 0 {
				break
			}
			time.Sleep(10 * time.Microsecond)
		}
		r.asyncComplete = append(r.asyncComplete, float64(time.Since(t0).Nanoseconds()))
		r.asyncWork = append(r.asyncWork, float64((started + busy).Nanoseconds()))
		return started, nil
	}
	p = togglePair{}
	if p.act, p.deact, err = measureToggles(ctx, h.Cfg.AsyncReps, 3, asyncFn); err != nil {
		return r, fmt.Errorf("int3-async: %w", err)
	}
	r.async = &p

	stop := func(ctx context.Context, v bool) (time.Duration, error) {
		t0 := time.Now()
		_, err := xmod.Stop(ctx, tr, pick(v), xmod.StopOptions{})
		return time.Since(t0), err
	}
	p = togglePair{}
	if p.act, p.deact, err = measureToggles(ctx, h.Cfg.AsyncReps, 3, stop); err != nil {
		return r, fmt.Errorf("stop: %w", err)
	}
	r.stop = &p
	if err := checkLive(ctx, t, func(v bool) error { _, err := stop(ctx, v); return err }); err != nil {
		return r, fmt.Errorf("after the int3/stop rows: %w", err)
	}
	if err := tr.Detach(); err != nil {
		return r, err
	}
	if _, err := t.Quit(ctx); err != nil {
		return r, err
	}
	return r, nil
}

func (h *Harness) reportTracedToggles(sec *Section, r *tracedToggles, list *probelist.List) {
	if r.int3 != nil {
		p, _ := probeOf(list, "probed", probelist.KindEntry)
		h.addToggleRow(sec, "int3", "int3", *r.int3, fmt.Sprintf("site %s (nop placeholder), straddle %q, wait %s + Sync per phase", p.Encoding, p.Straddle, h.waitText()))
	}
	if r.async != nil {
		cs, ws := Summarize(r.asyncComplete, h.TSC), Summarize(r.asyncWork, h.TSC)
		h.Rep.Stats["toggle_detail.int3_async.complete"] = cs
		h.Rep.Stats["toggle_detail.int3_async.caller_work"] = ws
		h.addToggleRow(sec, "int3_async", "int3-async", *r.async, "until complete: "+Cell(cs)+"; Start plus every Finish call: "+Cell(ws))
	}
	if r.stop != nil {
		h.addToggleRow(sec, "stop", "stop", *r.stop, "interrupt every thread, check PCs, write, resume")
	}
}
