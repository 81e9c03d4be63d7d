package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/edgeprobe/edgeprobe/internal/hotpatch"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procmaps"
	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// spanVariants are the ways row 2b writes a whole batch, in the order each
// pass runs them: the primitive (xmod.Flip on /proc/PID/mem) one byte per
// site and as checked spans, then the command's path (a hotpatch.Session:
// select '*', read every site, flip, read back) both ways.
var spanVariants = []string{"flip_onebyte", "flip_unchecked", "flip_spans_page", "flip_spans", "session_onebyte", "session_spans_first", "session_spans"}

// measureSpans is row 2b: the batch row's flip program, all probes enabled
// then disabled, each variant once per pass, interleaved, BatchReps passes.
func (h *Harness) measureSpans(ctx context.Context, bin string, l *probelist.List) (map[string][]float64, *xmod.SpanStats, error) {
	r, err := h.startSpans(ctx, bin, l)
	if err != nil {
		return nil, nil, err
	}
	defer r.close()
	out, err := h.timeSpans(r)
	if err != nil {
		return nil, nil, err
	}
	if err := h.finishSpans(ctx, r); err != nil {
		return nil, nil, err
	}
	return out, r.stats, nil
}

// spanRun is row 2b's running program, its memory, the session over it
// and the ways a batch is written, each a function of the direction.
type spanRun struct {
	t      *Target
	mem    *ptrace.Mem
	s      *hotpatch.Session // nil once closed
	set    map[string]func(on bool) error
	stats  *xmod.SpanStats // flip_spans' last batch
	imaged [2][2]int       // the span session ways' spans, and how many were written from their images (D61)
}

func (r *spanRun) close() {
	if r.s != nil {
		r.s.Close()
	}
	if r.mem != nil {
		r.mem.Close()
	}
	r.t.Kill()
}

// startSpans starts the program, opens its memory and a session over it,
// and prepares and verifies every session way's selections (once per
// session, as in `hotpatch session`), so that nothing of that is timed.
func (h *Harness) startSpans(ctx context.Context, bin string, l *probelist.List) (*spanRun, error) {
	t, err := Start(ctx, nil, bin, "exec")
	if err != nil {
		return nil, err
	}
	r := &spanRun{t: t, stats: &xmod.SpanStats{}}
	if err := h.openSpans(ctx, r, l); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (h *Harness) openSpans(ctx context.Context, r *spanRun, l *probelist.List) error {
	sites, err := Sites(r.t.Pid, l, "", "")
	if err != nil {
		return err
	}
	obj, err := procmaps.Main(r.t.Pid)
	if err != nil {
		return err
	}
	data, err := l.Compact()
	if err != nil {
		return err
	}
	idx, err := probelist.OpenCompact(data)
	if err != nil {
		return err
	}
	target := &hotpatch.Target{Object: obj, List: idx, Origin: "bench"}
	if r.mem, err = ptrace.OpenMem(r.t.Pid); err != nil {
		return err
	}
	listFile := filepath.Join(h.B.Dir, fmt.Sprintf("many%d-flip.spans.probes.json", h.Cfg.BatchFuncs))
	if err := l.WriteFile(listFile); err != nil {
		return err
	}
	if r.s, err = hotpatch.Open(r.t.Pid, []string{listFile}, false); err != nil {
		return err
	}
	r.s.SetBrief(true) // as hotpatch session and a hotpatch call without --json or -v
	all, err := probelist.ParseSelector("*", "")
	if err != nil {
		return err
	}
	mem, pid, stats := r.mem, r.t.Pid, r.stats
	r.set = map[string]func(on bool) error{
		"flip_onebyte": func(on bool) error {
			_, err := xmod.Flip(ctx, mem, changes(sites, on), xmod.FlipOptions{})
			return err
		},
		"flip_unchecked": func(on bool) error {
			_, err := xmod.Flip(ctx, mem, changes(sites, on), xmod.FlipOptions{Coalesce: true})
			return err
		},
		"flip_spans_page": func(on bool) error {
			pr, done, err := hotpatch.NewPristine(pid, []*hotpatch.Target{target})
			if err != nil {
				return err
			}
			defer done()
			_, err = xmod.Flip(ctx, mem, changes(sites, on), xmod.FlipOptions{Pristine: pr, MaxSpan: 4096})
			return err
		},
		"flip_spans": func(on bool) error {
			pr, done, err := hotpatch.NewPristine(pid, []*hotpatch.Target{target})
			if err != nil {
				return err
			}
			defer done()
			*stats = xmod.SpanStats{}
			_, err = xmod.Flip(ctx, mem, changes(sites, on), xmod.FlipOptions{Pristine: pr, Stats: stats})
			return err
		},
		"session_onebyte":     h.sessionSet(ctx, r.s, all, false, false, nil),
		"session_spans_first": h.sessionSet(ctx, r.s, all, true, true, &r.imaged[0]),
		"session_spans":       h.sessionSet(ctx, r.s, all, true, false, &r.imaged[1]),
	}
	if err := checkLive(ctx, r.t, r.set["session_spans"]); err != nil {
		return err
	}
	for _, v := range spanVariants {
		if strings.HasPrefix(v, "session_") {
			for _, on := range []bool{true, false} {
				if err := r.set[v](on); err != nil {
					return fmt.Errorf("%s: %w", v, err)
				}
			}
		}
	}
	r.imaged = [2][2]int{}
	return nil
}

// timeSpans times BatchReps passes of every way, interleaved.
func (h *Harness) timeSpans(r *spanRun) (map[string][]float64, error) {
	unpin := h.pinHarness()
	defer unpin()
	out := map[string][]float64{}
	for i := 0; i < h.Cfg.BatchReps; i++ {
		for _, v := range spanVariants {
			// The span session ways cost milliseconds a batch: several
			// rounds per pass, the two alternating, for a steadier median.
			ways, rounds := []string{v}, 1
			switch v {
			case "session_spans_first":
				ways, rounds = []string{"session_spans_first", "session_spans"}, spanSessionRounds
			case "session_spans":
				continue // with session_spans_first
			}
			for k := 0; k < rounds; k++ {
				for _, w := range ways {
					for _, on := range []bool{true, false} {
						c0 := processCPU()
						d, err := timeIt(func() error { return r.set[w](on) })
						if err != nil {
							return nil, fmt.Errorf("%s: %w", w, err)
						}
						out[w] = append(out[w], d)
						if rounds > 1 {
							out[cpuKey+w] = append(out[cpuKey+w], processCPU()-c0)
						}
					}
				}
			}
		}
	}
	return out, nil
}

// finishSpans checks that the two span session ways measured what they
// say (no first batch wrote a span from an image; the toggled ones did,
// all of them unless the target changed a span's bytes meanwhile), closes
// the session before the target exits (a tracer in this process would
// otherwise reap it before Quit's wait does), and checks its final counts.
func (h *Harness) finishSpans(ctx context.Context, r *spanRun) error {
	if r.imaged[0][1] != 0 || r.imaged[1][1] == 0 {
		return fmt.Errorf("span images: first batches wrote %d of %d spans from them, toggled ones %d of %d", r.imaged[0][1], r.imaged[0][0], r.imaged[1][1], r.imaged[1][0])
	}
	h.Rep.Set("batch20k.session_spans_imaged_share", float64(r.imaged[1][1])/float64(r.imaged[1][0]))
	s := r.s
	r.s = nil
	if err := s.Close(); err != nil {
		return err
	}
	c, err := r.t.Quit(ctx)
	if err != nil {
		return err
	}
	if c.Calls == 0 || c.Enters == 0 || c.Exits == 0 || c.Enters > c.Calls || c.Exits > c.Calls {
		return fmt.Errorf("implausible final counts %+v", c)
	}
	return nil
}

// cpuKey prefixes, in measureSpans' samples, a span session way's CPU
// time per batch (the harness process's, every thread: D74).
const cpuKey = "cpu:"

// processCPU is the CPU time this process has used, in ns.
func processCPU() float64 {
	var r syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &r) != nil {
		return 0
	}
	return float64(r.Utime.Nano() + r.Stime.Nano())
}

// spanSessionRounds is how many times row 2b's span session ways run,
// alternating, in each pass (the other ways once).
const spanSessionRounds = 5

// sessionSet turns every probe on or off through one Session.Apply, as one
// `hotpatch --enable '*'` does after its lock and targets. first: the
// selection's images are dropped before (D61), so that the batch is as a
// selection's first, the one a single hotpatch call makes. The first
// batches select the probes by their object too (the same probes: the
// session has one target), a selection of their own: dropping its images
// leaves those of the toggled selection, which the toggled way uses.
//
// imaged, when not nil, accumulates the batches' spans ([0]) and how many
// of them were written from their images ([1]).
func (h *Harness) sessionSet(ctx context.Context, s *hotpatch.Session, all probelist.Selector, spans, first bool, imaged *[2]int) func(bool) error {
	return func(on bool) error {
		s.SetSpanWrites(spans)
		actions := []hotpatch.Action{{Enable: on, Selector: all}}
		if first {
			if len(s.Targets()) != 1 {
				return fmt.Errorf("first-batch way: %d targets, want 1", len(s.Targets()))
			}
			actions[0].Object = s.Targets()[0].Object.Path
			s.DropImagesOf(actions, hotpatch.ProtoFlip)
		}
		res, err := s.Apply(ctx, actions, hotpatch.ProtoFlip, 0)
		if err != nil {
			return err
		}
		if !res.OK || len(res.Warnings) > 0 {
			return fmt.Errorf("batch not clean: ok=%v, warnings %q", res.OK, res.Warnings)
		}
		if imaged != nil && res.Spans != nil {
			imaged[0] += res.Spans.Spans
			imaged[1] += res.Spans.Imaged
		}
		return nil
	}
}

// reportSpans is row 2b.
func (h *Harness) reportSpans(probes int, m map[string][]float64, st *xmod.SpanStats) *Section {
	sec := &Section{Title: fmt.Sprintf("2b. Batch writes: checked spans against one byte per site (%d probes)", probes),
		Text: fmt.Sprintf("The batch row's flip program; a pass enables every probe with one call, then disables them all, each way below once per pass (the two span session ways %d times each, alternating), interleaved, %d passes; time per probe over both directions. "+
			"Checked spans (docs/protocols.md, \"Batches at page speed\"): reads grouped per run (64 KiB for xmod.Flip, 256 KiB for a session's prepared selection; process_vm_readv from 16 KiB), each run of sites re-read, compared with the object's file outside probe sites (or with the span as it was checked before its last write: D61), written with one pwrite (two across a page boundary) and read back. "+
			"The session rows are one hotpatch.Session (as `hotpatch session` toggling `'*'`) after locking and loading the list, the selection prepared once (D46): each batch reads every site, flips, reads back. "+
			"Toggled back and forth, a selection keeps its last grouped read with its states and its spans as checked and as written, from its second batch on, and uses them when the bytes read are the same (D61); "+
			"the first-batch row (a selection of its own) drops its own before each batch: what one `hotpatch --enable '*'` call does after its lock, list and selection.", spanSessionRounds, h.Cfg.BatchReps),
		Head: []string{"how", "per probe", "ratio", "whole batch"}}
	k := 1 / float64(probes)
	base := Summarize(m["flip_onebyte"], h.TSC).Scale(k)
	sbase := Summarize(m["session_onebyte"], h.TSC).Scale(k)
	names := map[string]string{
		"flip_onebyte":        "flip, one byte per site (xmod.Flip; same run as the rows below)",
		"flip_unchecked":      "flip, unchecked page spans (FlipOptions.Coalesce: no file check, no read-back; unsafe beside a writer, the control)",
		"flip_spans_page":     "flip, checked spans of at most one page (MaxSpan 4 KiB)",
		"flip_spans":          fmt.Sprintf("flip, checked spans of at most 64 KiB, the default (%d spans, %d sites one byte)", st.Spans, st.OneByte),
		"session_onebyte":     "hotpatch session `--enable/--disable '*'`, one byte per site",
		"session_spans_first": "hotpatch session `--enable/--disable '*'`, checked spans, each batch a selection's first (one hotpatch call)",
		"session_spans":       "hotpatch session `--enable/--disable '*'`, checked spans, toggled back and forth",
	}
	if share, ok := h.Rep.Values["batch20k.session_spans_imaged_share"].(float64); ok {
		names["session_spans"] += fmt.Sprintf(" (%.0f%% of its spans written from their images)", 100*share)
	}
	for _, v := range spanVariants {
		s := Summarize(m[v], h.TSC).Scale(k)
		h.Rep.SetStat("batch20k."+v+"_per_probe", s)
		if c := m[cpuKey+v]; len(c) > 0 {
			// Beside the wall time: on a machine that is ours they agree
			// (D74); a wall well above it says the run was disturbed.
			cpu := Summarize(c, h.TSC).Scale(k).MedianNs
			h.Rep.Set("batch20k."+v+"_cpu_per_probe", cpu)
			names[v] += fmt.Sprintf("; CPU %.1f ns a probe", cpu)
		}
		ref := base
		if strings.HasPrefix(v, "session_") {
			ref = sbase
		}
		ratio := ""
		if ref.MedianNs > 0 {
			ratio = fmt.Sprintf("%.3fx one byte per site", s.MedianNs/ref.MedianNs)
			h.Rep.Set("batch20k_ratio."+v, s.MedianNs/ref.MedianNs)
		}
		sec.Rows = append(sec.Rows, []string{names[v], Cell(s), ratio, Cell(s.Scale(float64(probes)))})
	}
	sec.Foot = "Target (issue 13): all 40,000 probes at <= 50 ns per probe (<= 2 ms for the batch)."
	return sec
}
