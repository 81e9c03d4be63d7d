package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/shm"
)

// argsRing is the ring size the row's captures ask for: every event of a
// run fits (8 cells per call at most), so no run takes the cheaper drop path.
const argsRing = 1 << 20

// RunArgs is row 1d: the cost per call of an fentry probe while a trace
// records the call's arguments and return value, next to the same probe
// timing only and traced without arguments. bench/argsmicro.c's loop of
// ArgsN calls, coldpatched, under the runtime; each variant is one process,
// the variants interleaved run by run, each against a cold run (probes off)
// of the same round.
func (h *Harness) RunArgs(ctx context.Context) error {
	obj, err := h.B.Build("argsmicro-fentry.o", "gcc", []string{"-O2", "-g", "-pg", "-mfentry", "-c"}, "bench/argsmicro.c")
	if err != nil {
		return err
	}
	bin, err := h.B.Build("argsmicro-fentry", "gcc", []string{"-O2", "-g"}, obj)
	if err != nil {
		return err
	}
	cold, _, err := h.B.Cold(bin, "argsmicro-fentry.cold", "flip")
	if err != nil {
		return err
	}
	hp, err := h.buildHotpatch()
	if err != nil {
		return err
	}
	n := h.Cfg.ArgsN
	if n <= 0 {
		n = 100000
	}
	type variant struct {
		key, name string
		str       bool     // hits(long, const char *) instead of hit(long, long, double)
		enable    bool     // probes on without a capture
		trace     []string // a capture's extra flags; nil: no capture
		perCall   []float64
	}
	vs := []*variant{
		{key: "cold", name: "probes off (coldpatched)"},
		{key: "timing", name: "probes on: counts and latency", enable: true},
		{key: "trace", name: "traced: entry and exit events", trace: []string{}},
		{key: "args", name: "traced with --args --retval: 2 integer + 1 double argument, integer return", trace: []string{"--args", "hit", "--retval", "hit"}},
		{key: "cold_str", name: "probes off, string variant", str: true},
		{key: "args_str", name: "traced with --args --retval: integer + char * argument (24-byte string copied), integer return", str: true,
			trace: []string{"--args", "hits", "--retval", "hits"}},
	}
	for i := 0; i < h.Cfg.Reps+1; i++ {
		for _, v := range vs {
			ns, err := h.argsRun(ctx, hp, cold, n, v.str, v.enable, v.trace)
			if err != nil {
				return fmt.Errorf("%s: %w", v.key, err)
			}
			if i > 0 { // the first round is a warm-up
				v.perCall = append(v.perCall, ns/float64(n))
			}
		}
	}
	sec := Section{Title: "1d. Arguments and return values (fentry, `hotpatch trace --args --retval`)",
		Text: fmt.Sprintf("bench/argsmicro.c (gcc -O2 -pg -mfentry, coldpatched), %d calls per run of `hit(long, long, double)` or `hits(long, const char *)`, "+
			"%d runs of each variant interleaved (after a warm-up round), each a fresh process under the runtime. "+
			"Traced runs ask for %d-event rings, so nothing is dropped (checked). Per call = (per-call time - the same round's cold run), entry and exit probe together.", n, h.Cfg.Reps, argsRing),
		Head: []string{"variant", "per call", "vs probes off, per call", "vs timing only"}}
	byKey := map[string]*variant{}
	for _, v := range vs {
		byKey[v.key] = v
	}
	diff := func(v, ref *variant) Summary {
		d := make([]float64, len(v.perCall))
		for i := range d {
			d[i] = v.perCall[i] - ref.perCall[i]
		}
		return Summarize(d, h.TSC)
	}
	timing := diff(byKey["timing"], byKey["cold"])
	for _, v := range vs {
		pc := Summarize(v.perCall, h.TSC)
		h.Rep.Stats["args_detail.per_call."+v.key] = pc
		row := []string{v.name, Cell(pc), "", ""}
		ref := byKey["cold"]
		if v.str {
			ref = byKey["cold_str"]
		}
		if v != ref {
			c := diff(v, ref)
			h.Rep.SetStat("args."+v.key, c)
			row[2] = Cell(c)
			if v.key != "timing" && timing.MedianNs > 0 {
				row[3] = fmt.Sprintf("x%.2f", c.MedianNs/timing.MedianNs)
				h.Rep.Set("args_ratio."+v.key, c.MedianNs/timing.MedianNs)
			}
		}
		sec.Rows = append(sec.Rows, row)
	}
	sec.Foot = "Ratios are of medians within this run. A char * argument costs a `process_vm_readv` of 64 bytes per call (the copy that cannot fault the process); integer and SSE registers are stores into the ring. " +
		"The rings are fresh in each run, so the traced figures include the first touch of every ring page the run writes (an argument record takes 2-4 cells beside the event's one): what a capture pays until its rings have wrapped once."
	h.Rep.Add(sec)
	return nil
}

// argsRun runs argsmicro once and returns the loop's ns: probes off, on
// (enable), or on inside a capture with the given flags.
func (h *Harness) argsRun(ctx context.Context, hp, bin string, n int, str, enable bool, trace []string) (float64, error) {
	return h.microCapture(ctx, hp, bin, "hit", n, str, enable, trace, false)
}

// microCapture runs argsmicro (fn: the function its loop calls) once and
// returns the loop's ns. With a capture, every call's two events must be
// kept, or, when filteredOut, none at all.
func (h *Harness) microCapture(ctx context.Context, hp, bin, fn string, n int, str, enable bool, trace []string, filteredOut bool) (float64, error) {
	args := []string{bin, strconv.Itoa(n)}
	if str {
		args = append(args, "str")
		fn = "hits"
	}
	// The target on its core, hotpatch (which decodes and writes what the
	// target records) on the other.
	undo := h.pinChild()
	t, err := Start(ctx, []string{"LD_PRELOAD=" + h.Runtime, "EDGEPROBE_QUIET=1", "EDGEPROBE_MAX_THREADS=4",
		"EDGEPROBE_RING_MAX=" + strconv.Itoa(argsRing)}, args...)
	undo()
	if err != nil {
		return 0, err
	}
	defer t.Kill()
	pid := strconv.Itoa(t.Pid)
	defer h.pinHarness()()
	if enable {
		if out, err := exec.CommandContext(ctx, hp, "--pid", pid, "--enable", fn).CombinedOutput(); err != nil {
			return 0, fmt.Errorf("hotpatch --enable: %v: %s", err, out)
		}
	}
	var capture *exec.Cmd
	var stdout, stderr bytes.Buffer
	if trace != nil {
		out := filepath.Join(h.B.Dir, "argsmicro-"+pid+".pftrace")
		defer os.Remove(out)
		capture = exec.CommandContext(ctx, hp, append([]string{"trace", "--pid", pid, "--enable", fn, "--duration", "10m",
			"--ring-events", strconv.Itoa(argsRing), "-o", out, "--json"}, trace...)...)
		capture.Stdout, capture.Stderr = &stdout, &stderr
		if err := capture.Start(); err != nil {
			return 0, err
		}
		defer capture.Process.Kill()
		region, err := shm.OpenPID(t.Pid)
		if err != nil {
			return 0, err
		}
		deadline := time.Now().Add(time.Minute)
		for region.Control()&shm.CtlTrace == 0 { // the capture's state, polled
			if time.Now().After(deadline) {
				region.Close()
				return 0, fmt.Errorf("the capture did not start within a minute: %s", stderr.String())
			}
			time.Sleep(time.Millisecond)
		}
		region.Close()
	}
	if err := t.Send("go"); err != nil {
		return 0, err
	}
	line, err := t.ReadLine(ctx, 10*time.Minute)
	if err != nil {
		return 0, err
	}
	r, err := parseMicro([]string{line}, int64(n))
	if err != nil {
		return 0, err
	}
	if capture != nil {
		capture.Process.Signal(syscall.SIGINT)
		if err := capture.Wait(); err != nil {
			return 0, fmt.Errorf("hotpatch trace: %v: %s", err, stderr.String())
		}
		var sum struct {
			Events  uint64 `json:"events"`
			Dropped uint64 `json:"dropped_events"`
		}
		if err := json.Unmarshal(stdout.Bytes(), &sum); err != nil {
			return 0, fmt.Errorf("trace summary %q: %v", stdout.String(), err)
		}
		switch {
		case filteredOut && (sum.Dropped != 0 || sum.Events != 0):
			return 0, fmt.Errorf("the capture kept %d events and dropped %d, want every call filtered out", sum.Events, sum.Dropped)
		case !filteredOut && (sum.Dropped != 0 || sum.Events < 2*uint64(n)):
			return 0, fmt.Errorf("the capture kept %d events and dropped %d, want all %d", sum.Events, sum.Dropped, 2*n)
		}
	}
	if err := t.Send("end"); err != nil {
		return 0, err
	}
	if _, err := t.Finish(ctx, time.Minute); err != nil {
		return 0, err
	}
	return r.ns, nil
}
