package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/elfscan"
	"github.com/edgeprobe/edgeprobe/internal/hotpatch"
	"github.com/edgeprobe/edgeprobe/internal/probecache"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procmaps"
	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// RunCLI is row 6: one `hotpatch` toggle as a script runs it, exec to exit,
// on the batch row's generated program, next to a bare `hotpatch --help`;
// then where the time of one toggle goes, phase by phase.
func (h *Harness) RunCLI(ctx context.Context) error {
	r, err := h.startCLI(ctx)
	if err != nil {
		return err
	}
	defer r.close()
	m, err := r.measure(ctx)
	if err != nil {
		return err
	}
	ph, err := r.phases(ctx)
	if err != nil {
		return err
	}
	own, err := r.ownPhases(ctx)
	if err != nil {
		return err
	}
	peers, skipped := r.measurePeers(ctx)
	if _, err := r.t.Quit(ctx); err != nil {
		return err
	}
	h.reportCLI(r, m, ph, peers, skipped)
	h.reportOwnPhases(own)
	return nil
}

// cliRun is the generated program running, its flip list, the hotpatch
// command and the private cache directory its calls share.
type cliRun struct {
	h        *Harness
	t        *Target
	hotpatch string
	bin      string // the program (coldpatched, flip)
	list     string // the JSON probe list
	probes   int
	cache    string
	fn       string // the function toggled
}

func (h *Harness) startCLI(ctx context.Context) (*cliRun, error) {
	n := h.Cfg.BatchFuncs
	bin, err := h.buildMany(n, false)
	if err != nil {
		return nil, err
	}
	flipBin, flipList, err := h.B.Cold(bin, fmt.Sprintf("many%d-flip", n), probelist.PlaceholderFlip)
	if err != nil {
		return nil, err
	}
	r := &cliRun{h: h, bin: flipBin, list: filepath.Join(h.B.Dir, fmt.Sprintf("many%d-flip.probes.json", n)), probes: len(flipList.Probes), fn: fmt.Sprintf("f%d", n/2)}
	if err := flipList.WriteFile(r.list); err != nil {
		return nil, err
	}
	r.hotpatch = filepath.Join(h.B.Dir, "hotpatch")
	cmd := exec.Command("go", "build", "-o", r.hotpatch, "./cmd/hotpatch")
	cmd.Dir = h.B.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // as make builds it (D67)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ./cmd/hotpatch: %v\n%s", err, out)
	}
	if r.cache, err = os.MkdirTemp(h.B.Dir, "cache-"); err != nil {
		return nil, err
	}
	if r.t, err = Start(ctx, nil, flipBin, "exec"); err != nil {
		os.RemoveAll(r.cache)
		return nil, err
	}
	// Entries made within probecache's racy margin of a file's change are
	// checked by content on every use: let the files age past it, as a
	// list written before a deployment has.
	time.Sleep(250 * time.Millisecond)
	return r, nil
}

func (r *cliRun) close() {
	r.t.Kill()
	os.RemoveAll(r.cache)
}

// run execs hotpatch once with args and returns its wall time, exec to
// exit, in ns; cache is EDGEPROBE_CACHE ("off" for none). The process's
// CPU time (user+sys, ns) is appended to cpu when cpu is not nil.
func (r *cliRun) run(ctx context.Context, cpu *[]float64, cache string, args ...string) (float64, error) {
	cmd := exec.CommandContext(ctx, r.hotpatch, args...)
	cmd.Env = append(os.Environ(), probecache.EnvDir+"="+cache)
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(t0)
	if err != nil {
		return 0, fmt.Errorf("hotpatch %v: %v: %s", args, err, firstLine(string(out)))
	}
	if cpu != nil {
		ps := cmd.ProcessState
		*cpu = append(*cpu, float64((ps.UserTime() + ps.SystemTime()).Nanoseconds()))
	}
	return float64(d.Nanoseconds()), nil
}

// cliSamples are the exec-to-exit times, ns, and for the cached kinds
// each call's CPU time (user+sys), ns.
type cliSamples struct {
	help, list, scan, listOff, scanOff []float64
	helpCPU, listCPU, scanCPU          []float64
}

// measure times `--help`, then toggles with the list and without it (the
// scan), each from the cache after a first call filled it, interleaved;
// then a few of each with the cache off.
func (r *cliRun) measure(ctx context.Context) (*cliSamples, error) {
	pid := strconv.Itoa(r.t.Pid)
	toggle := func(on bool) string {
		if on {
			return "--enable"
		}
		return "--disable"
	}
	m := &cliSamples{}
	var scratch []float64
	for i := -1; i < r.h.Cfg.Reps*3; i++ { // i = -1 fills the cache
		helpCPU, listCPU, scanCPU := &m.helpCPU, &m.listCPU, &m.scanCPU
		if i < 0 {
			helpCPU, listCPU, scanCPU = &scratch, &scratch, &scratch
		}
		d, err := r.run(ctx, helpCPU, r.cache, "--help")
		if err != nil {
			return nil, err
		}
		l, err := r.run(ctx, listCPU, r.cache, "--pid", pid, "--probes", r.list, toggle(i%2 == 0), r.fn)
		if err != nil {
			return nil, err
		}
		s, err := r.run(ctx, scanCPU, r.cache, "--pid", pid, toggle(i%2 != 0), r.fn)
		if err != nil {
			return nil, err
		}
		if i >= 0 {
			m.help, m.list, m.scan = append(m.help, d), append(m.list, l), append(m.scan, s)
		}
	}
	for i := 0; i < min(r.h.Cfg.Reps, 3); i++ {
		l, err := r.run(ctx, nil, "off", "--pid", pid, "--probes", r.list, toggle(i%2 == 0), r.fn)
		if err != nil {
			return nil, err
		}
		s, err := r.run(ctx, nil, "off", "--pid", pid, toggle(i%2 != 0), r.fn)
		if err != nil {
			return nil, err
		}
		m.listOff, m.scanOff = append(m.listOff, l), append(m.scanOff, s)
	}
	_, err := r.run(ctx, nil, r.cache, "--pid", pid, "--disable", r.fn)
	return m, err
}

// cliPhases are one toggle's steps as hotpatch takes them, each timed
// in this process over the same library calls, ns per sample.
var cliPhaseNames = []string{"thread", "runtime", "lock", "maps", "list", "scan", "attach", "verify", "write", "readback", "detach"}

// phases times each step of a toggle with the list (and the scan that
// replaces the list without one), from a warm cache, Reps*3 times after a
// round that fills this process's cache entries.
func (r *cliRun) phases(ctx context.Context) (map[string][]float64, error) {
	out := map[string][]float64{}
	sel, err := probelist.ParseSelector(r.fn, "")
	if err != nil {
		return nil, err
	}
	for i := -1; i < r.h.Cfg.Reps*3; i++ {
		t0 := time.Now()
		lap := func(name string) {
			now := time.Now()
			if i >= 0 {
				out[name] = append(out[name], float64(now.Sub(t0).Nanoseconds()))
			}
			t0 = now
		}
		if err := r.phaseRound(ctx, sel, i%2 == 0, lap); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// phaseRound is one toggle, lap called after each phase, on one thread
// that is its own tracer as hotpatch's is (ptrace.Run, D71): the detach
// phase ends when the process is released, after Run returns.
func (r *cliRun) phaseRound(ctx context.Context, sel probelist.Selector, on bool, lap func(string)) error {
	err := ptrace.Run(func() error { return r.phaseSteps(ctx, sel, on, lap) })
	lap("detach")
	return err
}

func (r *cliRun) phaseSteps(ctx context.Context, sel probelist.Selector, on bool, lap func(string)) error {
	lap("thread")
	// What an --enable checks first (hotpatch.EnsureRuntime), after the
	// first call did what there was to do: nothing left to load or route.
	st, err := hotpatch.EnsureRuntime(ctx, r.t.Pid, hotpatch.RuntimeOptions{NoInject: true})
	if err != nil {
		return err
	}
	if st.Loaded || st.Routed != 0 {
		return fmt.Errorf("runtime phase: %+v, want nothing done", st)
	}
	lap("runtime")
	lock, err := hotpatch.AcquireLock(r.t.Pid, false)
	if err != nil {
		return err
	}
	defer lock.Release()
	lap("lock")
	objs, err := procmaps.Objects(r.t.Pid)
	if err != nil {
		return err
	}
	lap("maps")
	cache, err := probecache.Open(r.cache)
	if err != nil {
		return err
	}
	defer cache.Close()
	x, err := cache.List(r.list)
	if err != nil {
		return err
	}
	idx, err := x.Select(sel)
	if err != nil {
		return err
	}
	var main *procmaps.Object
	for k := range objs {
		if objs[k].BuildID == x.Binary().BuildID {
			main = &objs[k]
		}
	}
	if main == nil {
		return errors.New("the list's object is not mapped")
	}
	var sites []xmod.Site
	for _, k := range idx {
		p, err := x.Probe(k)
		if err != nil {
			return err
		}
		sites = append(sites, xmod.Site{Addr: main.Runtime(uint64(p.Address)), Active: p.Active, Inert: p.Inert})
	}
	lap("list")
	for k := range objs {
		if _, err := cache.Scan(r.t.Pid, &objs[k]); err != nil && !errors.Is(err, elfscan.ErrNoHookSites) {
			return err
		}
	}
	lap("scan")
	// The lock is the leader-only attach (hotpatch.Lock): nothing is left
	// to attach, the phase stays for comparison with older reports.
	tr := lock.Tracer()
	lap("attach")
	_, err = xmod.Classify(tr, sites)
	lap("verify")
	if err == nil {
		_, err = xmod.Flip(ctx, tr, changes(sites, on), xmod.FlipOptions{})
		lap("write")
	}
	if err == nil {
		_, err = xmod.Classify(tr, sites)
		lap("readback")
	}
	if derr := tr.Detach(); err == nil {
		err = derr
	}
	return err
}

func (h *Harness) reportCLI(r *cliRun, m *cliSamples, ph map[string][]float64, peers map[string][]float64, skipped map[string]string) {
	help := Summarize(m.help, h.TSC)
	sec := Section{Title: "6. One CLI toggle, exec to exit",
		Text: fmt.Sprintf("`hotpatch` run as a script runs it, timed from exec to exit, on the batch row's generated program (%d probes) while its executor runs, toggling `%s` (2 probes) with the flip protocol; enable and disable alternate. "+
			"With the probe list (`--probes`, coldpatch's JSON) and without it (the scan of every mapped object), each from the per-user probe cache after a first call filled it; then the same with the cache off (`EDGEPROBE_CACHE=off`: the JSON parsed, every object scanned, as before the cache). "+
			"Next to it, a bare `hotpatch --help`: the same process's start-up and exit doing nothing. %d calls of each cached kind, interleaved; their CPU time (user+sys of the process, from its rusage) is the last column, which a loaded machine disturbs less than the wall time. "+
			"Then the peers on the same program and function, as whole commands (exec to exit, a first run untimed): perf probe, bpftrace, gdb; their ratio is to `--help` and to our cached toggle with the list.",
			r.probes, r.fn, len(m.help)),
		Head: []string{"command", "exec to exit", "x `hotpatch --help`", "CPU (user+sys), median"}}
	add := func(key, name string, s, cpu []float64) {
		sum := Summarize(s, h.TSC)
		h.Rep.SetStat("cli."+key, sum)
		ratio := ""
		if help.MedianNs > 0 {
			ratio = fmt.Sprintf("%.2fx", sum.MedianNs/help.MedianNs)
			if key != "help" {
				h.Rep.Set("cli_ratio."+key, sum.MedianNs/help.MedianNs)
			}
		}
		cpuCell := ""
		if len(cpu) > 0 {
			c := Summarize(cpu, h.TSC)
			h.Rep.SetStat("cli_cpu."+key, c)
			cpuCell = fmtNs(c.MedianNs)
		}
		sec.Rows = append(sec.Rows, []string{name, Cell(sum), ratio, cpuCell})
	}
	add("help", "`hotpatch --help`", m.help, m.helpCPU)
	add("toggle_list", "toggle with `--probes` (cached)", m.list, m.listCPU)
	add("toggle_scan", "toggle without `--probes`, second call (scans cached)", m.scan, m.scanCPU)
	add("toggle_list_uncached", "toggle with `--probes`, cache off (JSON parsed)", m.listOff, nil)
	add("toggle_scan_uncached", "toggle without `--probes`, cache off (every object scanned)", m.scanOff, nil)
	h.reportPeers(r, &sec, m, peers, skipped)
	h.Rep.Set("cli.probes", float64(r.probes))
	h.Rep.Add(sec)

	ps := Section{Title: "6b. Where one toggle's time goes",
		Text: fmt.Sprintf("The steps of the cached toggle with `--probes`, taken in this process with the library calls hotpatch makes, %d times each: "+
			"thread (the toggle's own thread started: ptrace.Run, which serves its tracer inline, D71), runtime (what every --enable checks first, with nothing left to load or route: the process's objects and their hook slots read; inject.Inspect), lock (seize the leader thread: the attach is the lock), maps (/proc/PID/maps, each object's ELF headers and build-id), list (open the cache, the list's entry, select and decode the 2 probes), "+
			"scan (instead of the list: every mapped object's cached scan), attach (nothing left since the lock attached), verify (read and classify the sites before writing), write (the flip), readback (classify after), detach (until the process is released: the thread's exit, D71). "+
			"Process start-up and exit are the `--help` row above and 6c.", len(ph["lock"])),
		Head: []string{"phase", "time"}}
	for _, name := range cliPhaseNames {
		s := Summarize(ph[name], h.TSC)
		h.Rep.SetStat("cli_phase."+name, s)
		ps.Rows = append(ps.Rows, []string{name, Cell(s)})
	}
	ps.Foot = "Targets (issue 13): a toggle with a list, and one without a list on a second call, each <= 3x `hotpatch --help` and <= 5 ms on a quiet machine. attach, verify, readback and detach are the protocol's (internal/ptrace, internal/xmod)."
	h.Rep.Add(ps)
}
