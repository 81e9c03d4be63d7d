package bench

import (
	"context"
	"fmt"
)

// RunInvoke is row 1's invocation and inert-site costs: micro.c's loop of
// InvokeN calls in each build, the builds interleaved run by run so every
// difference is against a baseline of the same moment.
func (h *Harness) RunInvoke(ctx context.Context) error {
	m, err := h.buildMicro()
	if err != nil {
		return err
	}
	n := h.Cfg.InvokeN
	type variant struct {
		key, name string
		bin       string
		env       []string
		runtime   bool
		want      uint64 // expected counted entries (runtime variants)
		perCall   []float64
	}
	vs := []*variant{
		{key: "uninstrumented", name: "uninstrumented build", bin: m.uninstr},
		{key: "glibc", name: "hooks active, glibc's empty __cyg_profile_func_* (no preload)", bin: m.instr},
		{key: "empty", name: "hooks active, empty handler (preloaded bench/emptyhooks.c)", bin: m.instr, env: []string{"LD_PRELOAD=" + m.emptyHooks}},
		{key: "runtime", name: "hooks active, edgeprobe runtime (preloaded libedgeprobe.so)", bin: m.instr, runtime: true, want: uint64(n)},
		{key: "runtime_count_only", name: "hooks active, edgeprobe runtime counting only (EDGEPROBE_TIMING=0)", bin: m.instr, env: []string{"EDGEPROBE_TIMING=0"}, runtime: true, want: uint64(n)},
		{key: "inert_flip", name: "inert, flip placeholder (cold)", bin: m.flip},
		{key: "inert_nop", name: "inert, nop placeholder (cold)", bin: m.nop},
	}
	for i := 0; i < h.Cfg.Reps+1; i++ {
		for _, v := range vs {
			r, err := h.runPlain(ctx, v.bin, n, v.env, v.runtime)
			if err != nil {
				return fmt.Errorf("%s: %w", v.key, err)
			}
			if v.runtime && (r.entries != v.want || r.exits != v.want) {
				return fmt.Errorf("%s: the runtime counted %d entries and %d exits, want %d", v.key, r.entries, r.exits, v.want)
			}
			if i > 0 { // the first round is a warm-up
				v.perCall = append(v.perCall, r.ns/float64(n))
			}
		}
	}
	base := vs[0].perCall
	diff := func(v *variant, ref []float64, scale float64, pct bool) Summary {
		d := make([]float64, len(v.perCall))
		for i := range d {
			d[i] = (v.perCall[i] - ref[i]) * scale
			if pct {
				d[i] = (v.perCall[i] - ref[i]) / ref[i] * 100
			}
		}
		return Summarize(d, h.TSC)
	}
	sec := Section{Title: "1b. Probe invocation and inert sites",
		Text: fmt.Sprintf("bench/micro.c, %d calls of `empty()` per run, %d runs of each build interleaved (after a warm-up round). "+
			"An enabled probe has exactly the instrumented build's bytes (enabling a cold site restores them), so the instrumented build stands for it here; row 4 measures a genuinely hot-patched process. "+
			"Invocation = (per-call time - uninstrumented) / 2: each call runs the entry and the exit probe.", n, h.Cfg.Reps),
		Head: []string{"build", "per call", "vs uninstrumented, per probe hit", "overhead vs uninstrumented", "overhead vs glibc empty hooks"}}
	for _, v := range vs {
		pc := Summarize(v.perCall, h.TSC)
		h.Rep.Stats["invoke_detail.per_call."+v.key] = pc
		row := []string{v.name, Cell(pc), "", "", ""}
		if v != vs[0] {
			hit := diff(v, base, 0.5, false)
			pct := diff(v, base, 1, true)
			pg := diff(v, vs[1].perCall, 1, true)
			h.Rep.Stats["invoke_detail.hit."+v.key] = hit
			row[2] = Cell(hit)
			row[3] = fmt.Sprintf("%+.1f%% (%+.1f..%+.1f)", pct.MedianNs, pct.P10Ns, pct.P90Ns)
			if v != vs[1] {
				row[4] = fmt.Sprintf("%+.1f%% (%+.1f..%+.1f)", pg.MedianNs, pg.P10Ns, pg.P90Ns)
			}
			switch v.key {
			case "empty", "runtime", "runtime_count_only", "glibc":
				h.Rep.SetStat("invoke."+v.key, hit)
			case "inert_flip":
				h.Rep.Set("inert_overhead_pct.flip", pct.MedianNs)
				h.Rep.Set("inert_overhead_pct.flip_vs_glibc_hooks", pg.MedianNs)
				h.Rep.SetStat("inert_site.flip", diff(v, base, 0.5, false))
			case "inert_nop":
				h.Rep.Set("inert_overhead_pct.nop", pct.MedianNs)
				h.Rep.Set("inert_overhead_pct.nop_vs_glibc_hooks", pg.MedianNs)
				h.Rep.SetStat("inert_site.nop", diff(v, base, 0.5, false))
			}
		}
		sec.Rows = append(sec.Rows, row)
	}
	sec.Foot = "`inert_overhead_pct.*` are percentages of the uninstrumented per-call time (an empty function's call, a few ns, so a fraction of a ns shows as tens of percent); negative `*_vs_glibc_hooks` means the inert site is that much cheaper than leaving the hooks on with glibc's empty functions. Paper (Table 2): invocation 35 ticks for fastinst's -finstrument-functions probes."
	h.Rep.Add(sec)
	return nil
}
