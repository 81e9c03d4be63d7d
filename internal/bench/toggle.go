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
	wait := h.Cfg.Int3Wait
	waitNote := h.waitText()
	sec := Section{Title: "1. Probe activation and deactivation (Table 2 shape)",
		Text: fmt.Sprintf("One probe (the entry site of `probed()` in bench/toggle.c), toggled from the Go harness in a separate C process while %d executor thread(s) call it in a loop (harness pinned to CPU 0, executors to CPU 1). "+
			"`flip` and its target use the flip placeholder; `int3`, `int3-async` and `stop` use a nop-placeholder copy (the multi-byte case they exist for), with the tracer attached once beforehand. int3 wait: %s. "+
			"For int3-async the toggle figure is the caller's `Start` (the wait is pushed off the calling thread, as in the paper); the time until the patch is complete is listed beside it. %d toggles per direction (int3-async/stop: %d) after a warm-up.",
			h.Cfg.Executors, waitNote, h.Cfg.ToggleReps, h.Cfg.AsyncReps),
		Head: []string{"protocol", "activation", "deactivation", "toggle (both)", "note"}}
	add := func(key, name string, act, deact []float64, note string) {
		a, d := Summarize(act, h.TSC), Summarize(deact, h.TSC)
		both := Summarize(append(append([]float64(nil), act...), deact...), h.TSC)
		h.Rep.Stats["toggle_detail."+key+".activation"] = a
		h.Rep.Stats["toggle_detail."+key+".deactivation"] = d
		h.Rep.SetStat("toggle."+key, both)
		sec.Rows = append(sec.Rows, []string{name, Cell(a), Cell(d), Cell(both), note})
	}
	defer func() { h.Rep.Add(sec) }()

	// flip: a plain /proc/PID/mem, no tracer.
	{
		t, err := h.startToggle(ctx, flipBin, h.Cfg.Executors)
		if err != nil {
			return err
		}
		defer t.Kill()
		sites, err := Sites(t.Pid, flipList, "probed", probelist.KindEntry)
		if err != nil {
			return err
		}
		mem, err := ptrace.OpenMem(t.Pid)
		if err != nil {
			return err
		}
		defer mem.Close()
		set := flipper(ctx, mem, sites)
		if err := checkLive(ctx, t, set); err != nil {
			return fmt.Errorf("flip target: %w", err)
		}
		// The bare 1-byte pwrite the flip is made of, for reference.
		one := sites[0].Inert[:1]
		unpin := h.pinHarness()
		var pw []float64
		for i := 0; i < h.Cfg.ToggleReps; i++ {
			t0 := time.Now()
			if err := mem.WriteMem(sites[0].Addr, one); err != nil {
				unpin()
				return err
			}
			pw = append(pw, float64(time.Since(t0).Nanoseconds()))
		}
		act, deact, err := measureToggles(ctx, h.Cfg.ToggleReps, 100, func(ctx context.Context, v bool) (time.Duration, error) {
			t0 := time.Now()
			err := set(v)
			return time.Since(t0), err
		})
		unpin()
		if err != nil {
			return fmt.Errorf("flip: %w", err)
		}
		h.Rep.SetStat("toggle_detail.pwrite_1byte", Summarize(pw, h.TSC))
		p, _ := probeOf(flipList, "probed", probelist.KindEntry)
		add("flip", "flip", act, deact, fmt.Sprintf("site %s, straddle %q; a bare 1-byte pwrite: %s", p.Encoding, p.Straddle, Cell(Summarize(pw, h.TSC))))
		if _, err := t.Quit(ctx); err != nil {
			return err
		}
	}

	// int3, int3-async and stop: a traced nop-placeholder target.
	t, err := h.startToggle(ctx, nopBin, h.Cfg.Executors)
	if err != nil {
		return err
	}
	defer t.Kill()
	sites, err := Sites(t.Pid, nopList, "probed", probelist.KindEntry)
	if err != nil {
		return err
	}
	tr, err := ptrace.Attach(t.Pid, ptrace.Options{})
	if err != nil {
		return fmt.Errorf("attach: %w", err)
	}
	defer tr.Detach()
	on, off := changes(sites, true), changes(sites, false)
	pick := func(v bool) []xmod.Change {
		if v {
			return on
		}
		return off
	}
	opts := xmod.Int3Options{Wait: wait}
	int3 := func(ctx context.Context, v bool) (time.Duration, error) {
		t0 := time.Now()
		_, err := xmod.Int3(ctx, tr, pick(v), opts)
		return time.Since(t0), err
	}
	if err := checkLive(ctx, t, func(v bool) error { _, err := int3(ctx, v); return err }); err != nil {
		return fmt.Errorf("int3 target: %w", err)
	}
	act, deact, err := measureToggles(ctx, h.Cfg.ToggleReps, 5, int3)
	if err != nil {
		return fmt.Errorf("int3: %w", err)
	}
	p, _ := probeOf(nopList, "probed", probelist.KindEntry)
	add("int3", "int3", act, deact, fmt.Sprintf("site %s (nop placeholder), straddle %q, wait %s + Sync per phase", p.Encoding, p.Straddle, waitNote))

	async := xmod.NewAsync(tr, opts)
	var complete, work []float64
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
		complete = append(complete, float64(time.Since(t0).Nanoseconds()))
		work = append(work, float64((started + busy).Nanoseconds()))
		return started, nil
	}
	act, deact, err = measureToggles(ctx, h.Cfg.AsyncReps, 3, asyncFn)
	if err != nil {
		return fmt.Errorf("int3-async: %w", err)
	}
	cs, ws := Summarize(complete, h.TSC), Summarize(work, h.TSC)
	h.Rep.Stats["toggle_detail.int3_async.complete"] = cs
	h.Rep.Stats["toggle_detail.int3_async.caller_work"] = ws
	add("int3_async", "int3-async", act, deact, "until complete: "+Cell(cs)+"; Start plus every Finish call: "+Cell(ws))

	stop := func(ctx context.Context, v bool) (time.Duration, error) {
		t0 := time.Now()
		_, err := xmod.Stop(ctx, tr, pick(v), xmod.StopOptions{})
		return time.Since(t0), err
	}
	act, deact, err = measureToggles(ctx, h.Cfg.AsyncReps, 3, stop)
	if err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	add("stop", "stop", act, deact, "interrupt every thread, check PCs, write, resume")
	if err := checkLive(ctx, t, func(v bool) error { _, err := stop(ctx, v); return err }); err != nil {
		return fmt.Errorf("after the int3/stop rows: %w", err)
	}
	if err := tr.Detach(); err != nil {
		return err
	}
	if _, err := t.Quit(ctx); err != nil {
		return err
	}
	sec.Foot = "Paper (Chamith et al., Table 2, TSC ticks, on a 2012-era Xeon): fastinst sync non-straddlers 300 / 120 / 35 (activation / deactivation / invocation), straddlers 8850 / 8435 / 35, callpatch 432 / 315 / 35; Dyninst 1,929,244 / 995,447 / 320; DTrace ~70,771 / - / 1176. Their toggles are in-process calls; ours cross a process boundary (a pwrite to /proc/PID/mem, or ptrace), so the floor is a system call."
	return nil
}
