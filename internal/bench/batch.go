package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// buildMany writes the generated sources for n functions and builds the
// program with gcc (-finstrument-functions) or, with xray, clang XRay.
func (h *Harness) buildMany(n int, xray bool) (string, error) {
	src := filepath.Join(h.B.Dir, fmt.Sprintf("many_funcs%d.c", n))
	data := GenMany(n)
	if old, err := os.ReadFile(src); err != nil || !bytes.Equal(old, data) {
		if err := os.WriteFile(src, data, 0o644); err != nil {
			return "", err
		}
	}
	if xray {
		return h.B.Build(fmt.Sprintf("many%d-xray", n), "clang", []string{"-O1", "-pthread", "-DXRAY", "-fxray-instrument", "-fxray-instruction-threshold=1"}, "bench/many_main.c", src)
	}
	return h.B.Build(fmt.Sprintf("many%d-instr", n), "gcc", []string{"-O1", "-pthread", "-finstrument-functions"}, "bench/many_main.c", src)
}

// RunBatch is row 2: every probe of the generated program enabled and
// disabled in one batch, per probe.
func (h *Harness) RunBatch(ctx context.Context) error {
	n := h.Cfg.BatchFuncs
	bin, err := h.buildMany(n, false)
	if err != nil {
		return err
	}
	flipBin, flipList, err := h.B.Cold(bin, fmt.Sprintf("many%d-flip", n), probelist.PlaceholderFlip)
	if err != nil {
		return err
	}
	nopBin, nopList, err := h.B.Cold(bin, fmt.Sprintf("many%d-nop", n), probelist.PlaceholderNop)
	if err != nil {
		return err
	}
	sec := Section{Title: fmt.Sprintf("2. Batch: all probes of a program with %d instrumented functions", n),
		Text: fmt.Sprintf("The generated program (internal/bench.GenMany + bench/many_main.c, gcc -O1) with %d probes, one executor thread calling every function in turn. "+
			"A pass enables every probe with one protocol call, then disables them all; %d passes. Time per probe = the call's time / probes. "+
			"`flip, one call per probe` calls xmod.Flip once per site, the way the paper timed each (de)activation.", len(flipList.Probes), h.Cfg.BatchReps),
		Head: []string{"protocol", "enable, per probe", "disable, per probe", "whole enable batch"}}
	defer func() { h.Rep.Add(sec) }()
	type proto struct {
		name string
		bin  string
		list *probelist.List
		run  func(ctx context.Context, t *Target, sites []xmod.Site) (on, off, single []float64, err error)
	}
	protos := []proto{
		{"flip", flipBin, flipList, func(ctx context.Context, t *Target, sites []xmod.Site) (on, off, single []float64, err error) {
			mem, err := ptrace.OpenMem(t.Pid)
			if err != nil {
				return
			}
			defer mem.Close()
			set := func(v bool) error { _, err := xmod.Flip(ctx, mem, changes(sites, v), xmod.FlipOptions{}); return err }
			if err = checkLive(ctx, t, set); err != nil {
				return
			}
			unpin := h.pinHarness()
			defer unpin()
			if on, off, err = timePasses(h.Cfg.BatchReps, set); err != nil {
				return nil, nil, nil, err
			}
			// One call per probe, enable pass then disable pass.
			for _, v := range []bool{true, false} {
				for _, s := range sites {
					d, e := timeIt(func() error {
						_, err := xmod.Flip(ctx, mem, []xmod.Change{{Site: s, On: v}}, xmod.FlipOptions{})
						return err
					})
					if e != nil {
						return nil, nil, nil, e
					}
					single = append(single, d)
				}
			}
			return
		}},
		{"int3", nopBin, nopList, func(ctx context.Context, t *Target, sites []xmod.Site) (on, off, single []float64, err error) {
			tr, err := ptrace.Attach(t.Pid, ptrace.Options{})
			if err != nil {
				return
			}
			defer tr.Detach()
			set := func(v bool) error {
				_, err := xmod.Int3(ctx, tr, changes(sites, v), xmod.Int3Options{Wait: h.Cfg.Int3Wait})
				return err
			}
			if err = checkLive(ctx, t, set); err != nil {
				return
			}
			if on, off, err = timePasses(h.Cfg.BatchReps, set); err != nil {
				return nil, nil, nil, err
			}
			err = tr.Detach()
			return
		}},
	}
	for _, p := range protos {
		t, err := Start(ctx, nil, p.bin, "exec")
		if err != nil {
			return err
		}
		sites, err := Sites(t.Pid, p.list, "", "")
		if err != nil {
			t.Kill()
			return err
		}
		on, off, single, err := p.run(ctx, t, sites)
		if err != nil {
			t.Kill()
			return fmt.Errorf("%s: %w", p.name, err)
		}
		c, err := t.Quit(ctx)
		if err != nil {
			return err
		}
		// A call in flight while its function's probes change may see only
		// one of them, so entries and exits may differ a little.
		if c.Calls == 0 || c.Enters == 0 || c.Exits == 0 || c.Enters > c.Calls || c.Exits > c.Calls {
			return fmt.Errorf("%s: implausible final counts %+v", p.name, c)
		}
		k := 1 / float64(len(sites))
		a, d := Summarize(on, h.TSC), Summarize(off, h.TSC)
		h.Rep.Stats["batch20k_detail."+p.name+".enable_per_probe"] = a.Scale(k)
		h.Rep.Stats["batch20k_detail."+p.name+".disable_per_probe"] = d.Scale(k)
		both := Summarize(append(append([]float64(nil), on...), off...), h.TSC).Scale(k)
		h.Rep.SetStat("batch20k."+p.name+"_per_probe", both)
		sec.Rows = append(sec.Rows, []string{p.name + fmt.Sprintf(" (%d probes)", len(sites)), Cell(a.Scale(k)), Cell(d.Scale(k)), Cell(a)})
		if single != nil {
			s := Summarize(single, h.TSC)
			h.Rep.SetStat("batch20k.flip_single_call", s)
			sec.Rows = append(sec.Rows, []string{"flip, one call per probe", Cell(s), "(both directions pooled)", ""})
		}
	}
	h.Rep.Set("batch20k.probes", float64(len(flipList.Probes)))
	h.Rep.Set("batch20k.functions", float64(n))
	sec.Foot = "Paper (Chamith et al. §8.3): 20,000 probes, each toggled by its own call; sync wordpatch 300/120 ticks for non-straddlers and ~8,800 for straddlers, callpatch 432/315 ticks."
	return nil
}

// timePasses times reps passes of set(true) then set(false): every probe
// enabled by one call, then disabled by one call.
func timePasses(reps int, set func(on bool) error) (on, off []float64, err error) {
	for i := 0; i < reps; i++ {
		a, err := timeIt(func() error { return set(true) })
		if err != nil {
			return nil, nil, err
		}
		d, err := timeIt(func() error { return set(false) })
		if err != nil {
			return nil, nil, err
		}
		on, off = append(on, a), append(off, d)
	}
	return on, off, nil
}

// timeIt returns how long f took, in ns.
func timeIt(f func() error) (float64, error) {
	t0 := time.Now()
	err := f()
	return float64(time.Since(t0).Nanoseconds()), err
}
