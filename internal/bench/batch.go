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
	sec := &Section{Title: fmt.Sprintf("2. Batch: all probes of a program with %d instrumented functions", n),
		Text: fmt.Sprintf("The generated program (internal/bench.GenMany + bench/many_main.c, gcc -O1) with %d probes, one executor thread calling every function in turn. "+
			"A pass enables every probe with one protocol call, then disables them all; %d passes. Time per probe = the call's time / probes. "+
			"`flip, one call per probe` calls xmod.Flip once per site, the way the paper timed each (de)activation.", len(flipList.Probes), h.Cfg.BatchReps),
		Head: []string{"protocol", "enable, per probe", "disable, per probe", "whole enable batch"}}
	var spans *Section // row 2b, after this one
	defer func() {
		h.Rep.Add(*sec)
		if spans != nil {
			h.Rep.Add(*spans)
		}
	}()
	for _, p := range []batchProto{{"flip", flipBin, flipList, h.flipBatch}, {"int3", nopBin, nopList, h.int3Batch}} {
		m, err := h.measureBatch(ctx, p)
		if err != nil {
			return err
		}
		h.reportBatch(sec, p.name, m)
	}
	sm, st, err := h.measureSpans(ctx, flipBin, flipList)
	if err != nil {
		return fmt.Errorf("spans: %w", err)
	}
	spans = h.reportSpans(len(flipList.Probes), sm, st)
	h.Rep.Set("batch20k.probes", float64(len(flipList.Probes)))
	h.Rep.Set("batch20k.functions", float64(n))
	sec.Foot = "Paper (Chamith et al. §8.3): 20,000 probes, each toggled by its own call; sync wordpatch 300/120 ticks for non-straddlers and ~8,800 for straddlers, callpatch 432/315 ticks."
	return nil
}

// batchProto is one protocol's batch: its build, its list and how a pass
// runs against a started target.
type batchProto struct {
	name string
	bin  string
	list *probelist.List
	run  func(ctx context.Context, t *Target, sites []xmod.Site) (*batchSamples, error)
}

// batchSamples are the whole-batch times (ns) of each pass and, for flip,
// of every one-probe call.
type batchSamples struct {
	on, off, single []float64
	probes          int
}

// measureBatch starts the protocol's target, runs its passes, and checks the
// target's final counts.
func (h *Harness) measureBatch(ctx context.Context, p batchProto) (*batchSamples, error) {
	t, err := Start(ctx, nil, p.bin, "exec")
	if err != nil {
		return nil, err
	}
	sites, err := Sites(t.Pid, p.list, "", "")
	if err != nil {
		t.Kill()
		return nil, err
	}
	m, err := p.run(ctx, t, sites)
	if err != nil {
		t.Kill()
		return nil, fmt.Errorf("%s: %w", p.name, err)
	}
	m.probes = len(sites)
	c, err := t.Quit(ctx)
	if err != nil {
		return nil, err
	}
	// A call in flight while its function's probes change may see only
	// one of them, so entries and exits may differ a little.
	if c.Calls == 0 || c.Enters == 0 || c.Exits == 0 || c.Enters > c.Calls || c.Exits > c.Calls {
		return nil, fmt.Errorf("%s: implausible final counts %+v", p.name, c)
	}
	return m, nil
}

// flipBatch times flip passes through a plain /proc/PID/mem, then one
// xmod.Flip call per probe, an enable pass and a disable pass.
func (h *Harness) flipBatch(ctx context.Context, t *Target, sites []xmod.Site) (*batchSamples, error) {
	mem, err := ptrace.OpenMem(t.Pid)
	if err != nil {
		return nil, err
	}
	defer mem.Close()
	set := func(v bool) error { _, err := xmod.Flip(ctx, mem, changes(sites, v), xmod.FlipOptions{}); return err }
	if err = checkLive(ctx, t, set); err != nil {
		return nil, err
	}
	unpin := h.pinHarness()
	defer unpin()
	m := &batchSamples{}
	if m.on, m.off, err = timePasses(h.Cfg.BatchReps, set); err != nil {
		return nil, err
	}
	for _, v := range []bool{true, false} {
		for _, s := range sites {
			d, e := timeIt(func() error {
				_, err := xmod.Flip(ctx, mem, []xmod.Change{{Site: s, On: v}}, xmod.FlipOptions{})
				return err
			})
			if e != nil {
				return nil, e
			}
			m.single = append(m.single, d)
		}
	}
	return m, nil
}

// int3Batch times int3 passes with the tracer attached once.
func (h *Harness) int3Batch(ctx context.Context, t *Target, sites []xmod.Site) (*batchSamples, error) {
	tr, err := ptrace.Attach(t.Pid, ptrace.Options{})
	if err != nil {
		return nil, err
	}
	defer tr.Detach()
	set := func(v bool) error {
		_, err := xmod.Int3(ctx, tr, changes(sites, v), xmod.Int3Options{Wait: h.Cfg.Int3Wait})
		return err
	}
	if err = checkLive(ctx, t, set); err != nil {
		return nil, err
	}
	m := &batchSamples{}
	if m.on, m.off, err = timePasses(h.Cfg.BatchReps, set); err != nil {
		return nil, err
	}
	return m, tr.Detach()
}

func (h *Harness) reportBatch(sec *Section, name string, m *batchSamples) {
	k := 1 / float64(m.probes)
	a, d := Summarize(m.on, h.TSC), Summarize(m.off, h.TSC)
	h.Rep.Stats["batch20k_detail."+name+".enable_per_probe"] = a.Scale(k)
	h.Rep.Stats["batch20k_detail."+name+".disable_per_probe"] = d.Scale(k)
	both := Summarize(append(append([]float64(nil), m.on...), m.off...), h.TSC).Scale(k)
	h.Rep.SetStat("batch20k."+name+"_per_probe", both)
	sec.Rows = append(sec.Rows, []string{name + fmt.Sprintf(" (%d probes)", m.probes), Cell(a.Scale(k)), Cell(d.Scale(k)), Cell(a)})
	if m.single != nil {
		s := Summarize(m.single, h.TSC)
		h.Rep.SetStat("batch20k.flip_single_call", s)
		sec.Rows = append(sec.Rows, []string{"flip, one call per probe", Cell(s), "(both directions pooled)", ""})
	}
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
