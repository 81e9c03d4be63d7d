package bench

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// MicroResult is one (variant, N) cell of the micro-benchmark.
type MicroResult struct {
	Variant string  `json:"variant"`
	N       int64   `json:"n"`
	Total   Summary `json:"total"`    // the loop's wall time
	PerCall Summary `json:"per_call"` // Total / N
	Counted bool    `json:"counted"`  // entries and exits were counted
	Entries uint64  `json:"entries"`  // of every run (checked equal to N)
	Exits   uint64  `json:"exits"`
	Note    string  `json:"note,omitempty"`
}

// microRun is one run's outcome.
type microRun struct {
	ns, ticks      float64
	entries, exits uint64
	counted        bool
	extra          map[string]float64 // "xray patch_ns=.." and the like
}

var kvRe = regexp.MustCompile(`(\w+)=(\d+)`)

func parseKV(line string) map[string]float64 {
	m := map[string]float64{}
	for _, kv := range kvRe.FindAllStringSubmatch(line, -1) {
		v, _ := strconv.ParseFloat(kv[2], 64)
		m[kv[1]] = v
	}
	return m
}

// parseMicro reads micro.c's output lines.
func parseMicro(lines []string, n int64) (microRun, error) {
	var r microRun
	ok := false
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "result "):
			kv := parseKV(l)
			if int64(kv["calls"]) != n {
				return r, fmt.Errorf("micro ran %v calls, want %d", kv["calls"], n)
			}
			r.ns, r.ticks, ok = kv["ns"], kv["ticks"], true
		case strings.HasPrefix(l, "xray "):
			r.extra = parseKV(l)
			r.entries, r.exits, r.counted = uint64(r.extra["entries"]), uint64(r.extra["exits"]), true
		}
	}
	if !ok {
		return r, fmt.Errorf("no result line in %q", lines)
	}
	return r, nil
}

// microBuilds are the micro.c binaries.
type microBuilds struct {
	uninstr, instr, clang, xray string
	flip, nop                   string
	flipList                    *probelist.List
	emptyHooks                  string
}

func (h *Harness) buildMicro() (*microBuilds, error) {
	var m microBuilds
	var err error
	if m.uninstr, err = h.B.Build("micro-uninstr", "gcc", []string{"-O2", "-g"}, "bench/micro.c"); err != nil {
		return nil, err
	}
	if m.instr, err = h.B.Build("micro-instr", "gcc", []string{"-O2", "-g", "-finstrument-functions"}, "bench/micro.c"); err != nil {
		return nil, err
	}
	if m.flip, m.flipList, err = h.B.Cold(m.instr, "micro-flip", probelist.PlaceholderFlip); err != nil {
		return nil, err
	}
	if m.nop, _, err = h.B.Cold(m.instr, "micro-nop", probelist.PlaceholderNop); err != nil {
		return nil, err
	}
	if m.emptyHooks, err = h.B.Build("libemptyhooks.so", "gcc", []string{"-O2", "-g", "-shared", "-fPIC"}, "bench/emptyhooks.c"); err != nil {
		return nil, err
	}
	// clang builds are optional: XRay's row says why when they fail.
	m.clang, _ = h.B.Build("micro-clang", "clang", []string{"-O2", "-g"}, "bench/micro.c")
	if x, err := h.B.Build("micro-xray", "clang", []string{"-O2", "-g", "-DXRAY", "-fxray-instrument", "-fxray-instruction-threshold=1"}, "bench/micro.c"); err == nil {
		m.xray = x
	} else {
		h.logf("xray build: %v", err)
		m.xray = "error: " + firstLine(err.Error())
	}
	return &m, nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// runPlain runs a micro binary to completion (optionally with a preload of
// the runtime, whose counts are then read back).
func (h *Harness) runPlain(ctx context.Context, bin string, n int64, env []string, withRuntime bool) (microRun, error) {
	return h.runPinned(ctx, bin, n, "", env, withRuntime, false)
}

// runPinned is runPlain with micro.c's second argument (mode "tsc": the
// loop calls empty_tsc(), one rdtsc more per call) and, with realtime, the
// run at real-time priority (pinChildRealtime).
func (h *Harness) runPinned(ctx context.Context, bin string, n int64, mode string, env []string, withRuntime, realtime bool) (microRun, error) {
	var outFile string
	if withRuntime {
		outFile = tempFile(h.B.Dir, "ep-out-*")
		defer os.Remove(outFile)
		env = append(env, "LD_PRELOAD="+h.Runtime, "EDGEPROBE_OUTPUT="+outFile, "EDGEPROBE_QUIET=1")
	}
	args := []string{strconv.FormatInt(n, 10)}
	if mode != "" {
		args = append(args, mode)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	undo := h.pinChild() // every variant on the same core: no migration mid-loop
	if realtime {
		unpin, undoRT := undo, h.pinChildRealtime()
		undo = func() { undoRT(); unpin() }
	}
	out, err := cmd.Output()
	undo()
	if err != nil {
		return microRun{}, fmt.Errorf("%s %d: %v %s", filepath.Base(bin), n, err, stderrOf(err))
	}
	r, err := parseMicro(strings.Split(strings.TrimSpace(string(out)), "\n"), n)
	if err != nil || !withRuntime {
		return r, err
	}
	r.entries, r.exits, err = runtimeCounts(outFile)
	r.counted = true
	return r, err
}

func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return strings.TrimSpace(string(ee.Stderr))
	}
	return ""
}

// runtimeCounts sums entries and exits over the runtime's output file.
func runtimeCounts(path string) (uint64, uint64, error) {
	if _, err := os.Stat(path); err != nil {
		return 0, 0, nil // no hook ever ran: the runtime may write nothing
	}
	r, err := shm.Open(path)
	if err != nil {
		return 0, 0, fmt.Errorf("runtime output: %w", err)
	}
	defer r.Close()
	var e, x uint64
	for _, f := range r.Functions() {
		e += f.Entries
		x += f.Exits
	}
	return e, x, nil
}

// runEnabled runs the cold flip build under the runtime and turns empty()'s
// probes on through /proc/PID/mem before the loop starts.
func (h *Harness) runEnabled(ctx context.Context, m *microBuilds, n int64, env []string) (microRun, error) {
	outFile := tempFile(h.B.Dir, "ep-out-*")
	defer os.Remove(outFile)
	t, err := Start(ctx, append(env, "LD_PRELOAD="+h.Runtime, "EDGEPROBE_OUTPUT="+outFile, "EDGEPROBE_QUIET=1"),
		m.flip, strconv.FormatInt(n, 10), "wait")
	if err != nil {
		return microRun{}, err
	}
	defer t.Kill()
	sites, err := Sites(t.Pid, m.flipList, "empty", "")
	if err != nil {
		return microRun{}, err
	}
	mem, err := ptrace.OpenMem(t.Pid)
	if err != nil {
		return microRun{}, err
	}
	_, err = xmod.Flip(ctx, mem, changes(sites, true), xmod.FlipOptions{})
	mem.Close()
	if err != nil {
		return microRun{}, err
	}
	if err := t.Send("go"); err != nil {
		return microRun{}, err
	}
	lines, err := t.Finish(ctx, 10*time.Minute)
	if err != nil {
		return microRun{}, err
	}
	r, err := parseMicro(lines, n)
	if err != nil {
		return r, err
	}
	r.entries, r.exits, err = runtimeCounts(outFile)
	r.counted = true
	return r, err
}

// symbol finds a function symbol's address, size and file offset.
func symbol(bin, name string) (addr, size, off uint64, err error) {
	f, err := elf.Open(bin)
	if err != nil {
		return
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		return
	}
	for _, s := range syms {
		if s.Name == name && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			for _, p := range f.Progs {
				if p.Type == elf.PT_LOAD && s.Value >= p.Vaddr && s.Value < p.Vaddr+p.Filesz {
					return s.Value, s.Size, s.Value - p.Vaddr + p.Off, nil
				}
			}
		}
	}
	return 0, 0, 0, fmt.Errorf("%s: no function %s", bin, name)
}

// retOffset returns the offset of empty()'s ret in the uninstrumented build
// (`nop; ret`), checked byte by byte.
func retOffset(bin string) (uint64, error) {
	addr, size, off, err := symbol(bin, "empty")
	if err != nil {
		return 0, err
	}
	f, err := os.Open(bin)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	b := make([]byte, size)
	if _, err := f.ReadAt(b, int64(off)); err != nil {
		return 0, err
	}
	if len(b) != 2 || b[0] != 0x90 || b[1] != 0xc3 {
		return 0, fmt.Errorf("empty() at %#x is % x, want 90 c3 (nop; ret)", addr, b)
	}
	return 1, nil
}

// RunMicro is row 4: the iProbe micro-benchmark.
func (h *Harness) RunMicro(ctx context.Context) error {
	m, err := h.buildMicro()
	if err != nil {
		return err
	}
	sec := &Section{Title: "4. iProbe micro-benchmark (Arora et al., Figure 5)",
		Text: "N calls of an empty function (bench/micro.c, `empty()` is `nop; ret` uninstrumented), entry and exit counted where the variant counts. Time is the loop's wall time (the program's own CLOCK_MONOTONIC); each run's counted entries and exits are checked equal to N. Per call = one entry and one exit.",
		Head: []string{"variant", "N", "loop time", "per call", "x uninstrumented", "entries / exits"}}
	defer func() { h.Rep.Add(*sec) }()
	base := map[int64]float64{} // the gcc baseline's median loop time by N
	for _, v := range h.microVariants(ctx, m) {
		ns := v.ns
		if ns == nil {
			ns = h.Cfg.MicroNs
		}
		if v.skip != "" {
			sec.Rows = append(sec.Rows, []string{v.name, "-", "not run: " + v.skip, "", "", ""})
			continue
		}
		for _, n := range ns {
			if v.maxN > 0 && n > v.maxN {
				sec.Rows = append(sec.Rows, []string{v.name, fmtCount(n), fmt.Sprintf("not run: N > %s (the per-call cost is measured at smaller N; this N would take ~%s per run)", fmtCount(v.maxN), estimate(h.Rep.Micro, v.name, n)), "", "", ""})
				continue
			}
			res, err := h.measureMicro(v, n)
			if err != nil {
				return err
			}
			h.reportMicro(sec, res, base)
		}
	}
	h.reportMicroHits(sec)
	return nil
}

// microVariant is one line of the micro-benchmark: a way to run micro.c.
type microVariant struct {
	name, note string
	run        func(n int64) (microRun, error)
	maxN       int64   // larger N are not run (0: no limit)
	ns         []int64 // its own sizes (nil: Cfg.MicroNs)
	skip       string  // why it cannot run here
	counted    bool    // entries and exits are counted and checked
}

// microVariants are edgeprobe's variants and the peers', in report order.
func (h *Harness) microVariants(ctx context.Context, m *microBuilds) []*microVariant {
	up := newUprobes(h)
	vars := []*microVariant{
		{name: "uninstrumented (gcc -O2)", run: func(n int64) (microRun, error) { return h.runPlain(ctx, m.uninstr, n, nil, false) }},
		{name: "inert (flip placeholder)", counted: true, note: "runtime preloaded; counts must be 0",
			run: func(n int64) (microRun, error) { return h.runPlain(ctx, m.flip, n, nil, true) }},
		{name: "edgeprobe enabled", counted: true, note: "cold flip build + runtime, empty()'s 2 probes flipped on through /proc/PID/mem before the loop",
			run: func(n int64) (microRun, error) { return h.runEnabled(ctx, m, n, nil) }},
		{name: "edgeprobe enabled, count only", counted: true, note: "the same with EDGEPROBE_TIMING=0 (no latency clock reads)",
			run: func(n int64) (microRun, error) { return h.runEnabled(ctx, m, n, []string{"EDGEPROBE_TIMING=0"}) }},
	}
	if m.clang != "" {
		vars = append(vars, &microVariant{name: "uninstrumented (clang -O2)", note: "XRay's baseline",
			run: func(n int64) (microRun, error) { return h.runPlain(ctx, m.clang, n, nil, false) }})
	}
	xv := &microVariant{name: "LLVM XRay", counted: true, note: "clang -fxray-instrument -fxray-instruction-threshold=1; __xray_patch() in the program, counting handler",
		run: func(n int64) (microRun, error) { return h.runPlain(ctx, m.xray, n, nil, false) }}
	if strings.HasPrefix(m.xray, "error: ") {
		xv.skip = "cannot build the XRay target: " + strings.TrimPrefix(m.xray, "error: ") + " (apt-get install libclang-rt-14-dev)"
	}
	vars = append(vars, xv)
	uv := &microVariant{name: "uprobe + uretprobe", counted: true, maxN: h.Cfg.UprobeMaxN,
		note: "tracefs uprobe_events on empty() of the uninstrumented build; counts from uprobe_profile",
		run:  func(n int64) (microRun, error) { return up.run(ctx, m.uninstr, n) }}
	if reason := up.available(); reason != "" {
		uv.skip = reason
	}
	vars = append(vars, uv)
	gv := &microVariant{name: "gdb breakpoints", counted: true, ns: h.Cfg.GdbNs,
		note: "break at empty and at its ret, commands: silent, continue; counts from info breakpoints",
		run:  func(n int64) (microRun, error) { return h.runGdb(ctx, m.uninstr, n) }}
	if _, err := exec.LookPath("gdb"); err != nil {
		gv.skip = "gdb is not installed (apt-get install gdb)"
	}
	return append(vars, gv)
}

// measureMicro runs variant v at size n its number of times, checking every
// run's counts.
func (h *Harness) measureMicro(v *microVariant, n int64) (MicroResult, error) {
	reps := h.Cfg.Reps
	if r, ok := h.Cfg.MicroReps[n]; ok {
		reps = r
	}
	if v.ns != nil || (v.maxN > 0 && n >= 10_000_000) {
		reps = min(reps, 3)
	}
	var tot []float64
	var last microRun
	for i := 0; i < reps; i++ {
		r, err := v.run(n)
		if err != nil {
			return MicroResult{}, fmt.Errorf("%s N=%d: %w", v.name, n, err)
		}
		want := uint64(n)
		if v.name == "inert (flip placeholder)" {
			want = 0
		}
		if v.counted && (r.entries != want || r.exits != want) {
			return MicroResult{}, fmt.Errorf("%s N=%d: counted %d entries and %d exits, want %d", v.name, n, r.entries, r.exits, want)
		}
		tot = append(tot, r.ns)
		last = r
	}
	ts := Summarize(tot, h.TSC)
	return MicroResult{Variant: v.name, N: n, Total: ts, PerCall: ts.Scale(1 / float64(n)), Counted: v.counted, Entries: last.entries, Exits: last.exits, Note: v.note}, nil
}

// reportMicro records one cell and its row; base collects the gcc
// baseline's times, which the ratios of later rows are against.
func (h *Harness) reportMicro(sec *Section, res MicroResult, base map[int64]float64) {
	h.Rep.Micro = append(h.Rep.Micro, res)
	if strings.HasPrefix(res.Variant, "uninstrumented (gcc") {
		base[res.N] = res.Total.MedianNs
	}
	ratio := ""
	if b := base[res.N]; b > 0 {
		ratio = fmt.Sprintf("%.2fx", res.Total.MedianNs/b)
	}
	counts := "not counted"
	if res.Counted {
		counts = fmt.Sprintf("%d / %d", res.Entries, res.Exits)
	}
	sec.Rows = append(sec.Rows, []string{res.Variant, fmtCount(res.N), Cell(res.Total), Cell(res.PerCall), ratio, counts})
}

// reportMicroHits derives the per-hit cost of each peer, (variant -
// baseline) / 2 per call, at the largest N both ran, and writes the foot.
func (h *Harness) reportMicroHits(sec *Section) {
	var hitNotes []string
	hit := func(key, variant, baseline string) {
		// The variant's largest N, against the baseline at the same N or,
		// when the baseline never ran at that N (gdb's small N), at its
		// smallest N (the baseline's per-call time hardly depends on N).
		var vr, br *MicroResult
		for i := range h.Rep.Micro {
			if r := &h.Rep.Micro[i]; r.Variant == variant && (vr == nil || r.N > vr.N) {
				vr = r
			}
		}
		for i := range h.Rep.Micro {
			r := &h.Rep.Micro[i]
			if vr != nil && r.Variant == baseline && (br == nil || r.N == vr.N || (br.N != vr.N && r.N < br.N)) {
				br = r
			}
		}
		if vr == nil || br == nil {
			h.Rep.Skip(key, "the "+variant+" variant did not run (see the micro-benchmark table)")
			return
		}
		per := (vr.PerCall.MedianNs - br.PerCall.MedianNs) / 2
		s := vr.PerCall.Scale(0.5)
		s.MedianNs, s.MedianTicks = per, h.TSC.Ticks(per)
		s.P10Ns, s.P90Ns = vr.PerCall.P10Ns/2-br.PerCall.MedianNs/2, vr.PerCall.P90Ns/2-br.PerCall.MedianNs/2
		s.P10Ticks, s.P90Ticks = h.TSC.Ticks(s.P10Ns), h.TSC.Ticks(s.P90Ns)
		h.Rep.SetStat(key, s)
		hitNotes = append(hitNotes, fmt.Sprintf("`%s` = %s per hit (N=%s, against %s)", key, Cell(s), fmtCount(vr.N), baseline))
	}
	hit("peers.edgeprobe_hit", "edgeprobe enabled", "uninstrumented (gcc -O2)")
	hit("peers.edgeprobe_count_hit", "edgeprobe enabled, count only", "uninstrumented (gcc -O2)")
	hit("peers.uprobe_hit", "uprobe + uretprobe", "uninstrumented (gcc -O2)")
	hit("peers.xray_hit", "LLVM XRay", "uninstrumented (clang -O2)")
	hit("peers.gdb_hit", "gdb breakpoints", "uninstrumented (gcc -O2)")
	sec.Foot = "Per probe hit ((variant - baseline) / 2 per call, spread from the variant's runs): " + strings.Join(hitNotes, "; ") + ".\n\n" +
		"Paper (Arora et al., Fig. 5, dual-core x86-64, Ubuntu 12.10): iProbe under 5x the uninstrumented time up to 10^8 calls (1.5 s at 10^8), DynInst ~25 s, SystemTap ~20 minutes."
}

func fmtCount(n int64) string {
	e := 0
	for m := n; m >= 10 && m%10 == 0; m /= 10 {
		e++
	}
	if e >= 3 && n == pow10(e) {
		return fmt.Sprintf("10^%d", e)
	}
	return strconv.FormatInt(n, 10)
}

func pow10(e int) int64 {
	r := int64(1)
	for ; e > 0; e-- {
		r *= 10
	}
	return r
}

// estimate extrapolates a variant's time at n from its largest run.
func estimate(rs []MicroResult, variant string, n int64) string {
	for i := len(rs) - 1; i >= 0; i-- {
		if rs[i].Variant == variant {
			return fmtNs(rs[i].PerCall.MedianNs * float64(n))
		}
	}
	return "?"
}
