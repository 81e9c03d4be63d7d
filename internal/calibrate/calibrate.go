package calibrate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// Variants of the sweep (Point.Variant).
const (
	// VariantInt3 is xmod.Int3 with NoSync: the time wait alone separates
	// the phases. The calibrated one.
	VariantInt3 = "int3"
	// VariantInt3Sync is xmod.Int3 with its per-phase Sync (a control).
	VariantInt3Sync = "int3+sync"
	// VariantFlip is xmod.Flip (a control; no wait).
	VariantFlip = "flip"
)

// DefaultWaits is the int3 sweep when Options.Waits is nil.
var DefaultWaits = []time.Duration{
	0, 100 * time.Nanosecond, 250 * time.Nanosecond, 500 * time.Nanosecond,
	time.Microsecond, 2 * time.Microsecond, 5 * time.Microsecond, 10 * time.Microsecond, 50 * time.Microsecond,
}

// Defaults for the zero values of Options.
const (
	DefaultToggles = 20000 // per point
	DefaultMargin  = 3.0
	MaxThreads     = 64 // the target's limit
)

// DefaultSplits are the straddling sites: stress_siteK has the split K|5-K.
// Site 0 (no straddle) may be added with Options.Splits.
var DefaultSplits = []int{1, 2, 3, 4}

// Options configure Run. The zero value is the default calibration.
type Options struct {
	// Waits is the int3 (NoSync) sweep; 0 means no wait at all. nil:
	// DefaultWaits. Sorted and de-duplicated by Run.
	Waits []time.Duration
	// SyncWaits are the waits of the int3+sync control rows. nil: no wait
	// only. SkipSync drops these rows.
	SyncWaits []time.Duration
	SkipSync  bool
	// SkipFlip drops the flip control rows.
	SkipFlip bool
	// TogglesPerPoint is how many toggles (half on, half off) each point
	// makes; rounded up to even so the site ends as it started. 0:
	// DefaultToggles.
	TogglesPerPoint int
	// Threads is the number of executor threads. 0: the number of CPUs, at
	// least 2.
	Threads int
	// Splits are the sites to toggle, by split K (K|5-K; 0: the
	// non-straddling site). nil: DefaultSplits.
	Splits []int
	// Margin multiplies the base wait into the recommended wait. 0:
	// DefaultMargin. At least 1.
	Margin float64
	// CC is the C compiler for the target; "": $CC, else gcc, clang, cc.
	CC string
	// Progress, if set, is called (on Run's goroutine) when a point starts,
	// about once a second while it runs, and when it completes.
	Progress func(Progress)
}

// Progress reports how far Run is.
type Progress struct {
	Point   Point         // the current point so far (complete if Done)
	Index   int           // Point's index in the sweep (0-based)
	Total   int           // points in the sweep
	Done    bool          // Point is complete
	Elapsed time.Duration // since Run started
}

// Point is one (variant, wait, split) of the sweep and what it measured.
type Point struct {
	Variant string `json:"variant"` // VariantInt3, VariantInt3Sync, VariantFlip
	WaitNs  int64  `json:"wait_ns"` // the time wait between phases; 0: none
	Split   string `json:"split"`   // "1|4", "2|3", "3|2", "4|1"; "none": no straddle
	Site    int    `json:"site"`    // K of stress_siteK
	Toggles int    `json:"toggles"` // toggles done
	// Failures = Torn + Bad + Crashes.
	Failures int `json:"failures"`
	Torn     int `json:"torn"`    // torn executions the target caught (its counter)
	Bad      int `json:"bad"`     // loop iterations whose return values were wrong
	Crashes  int `json:"crashes"` // the target died (and was restarted)
	// Reported is how many torn reports the target wrote on stderr during
	// the point (equal to Torn unless it died or the pipe lagged);
	// Reports holds the first few verbatim, then crash descriptions.
	Reported int      `json:"reported"`
	Reports  []string `json:"reports,omitempty"`
	// Held is how many times an executor reached the site while its int3
	// was in place and was held by the tracer; StaleTraps how many reached
	// an int3 after the site was complete again (rewound by the tracer).
	Held       int    `json:"held"`
	StaleTraps uint64 `json:"stale_traps"`
	ElapsedNs  int64  `json:"elapsed_ns"`
}

// Wait is the point's wait.
func (p Point) Wait() time.Duration { return time.Duration(p.WaitNs) }

// Machine describes where the calibration ran.
type Machine struct {
	CPUModel string `json:"cpu_model"`
	Kernel   string `json:"kernel"`
	NProc    int    `json:"nproc"`
	// LoadStart and LoadEnd are /proc/loadavg's three averages when Run
	// started and ended: the calibration competes with whatever else runs.
	LoadStart string `json:"load_start,omitempty"`
	LoadEnd   string `json:"load_end,omitempty"`
}

// Version is the calibration file's format version.
const Version = 1

// Protocol is what the calibrated wait is for.
const Protocol = "int3-nosync"

// Result is a calibration: the sweep and the wait chosen from it. Its JSON
// form is the calibration file.
type Result struct {
	Version int     `json:"version"`
	Machine Machine `json:"machine"`
	// WaitNs is the recommended int3 wait: BaseWaitNs x Margin. Zero when
	// no wait of the sweep qualified (Safe false).
	WaitNs int64 `json:"wait_ns"`
	// BaseWaitNs is the smallest positive wait of the sweep that had zero
	// failures, as had every larger wait (see the package doc).
	BaseWaitNs int64   `json:"base_wait_ns"`
	Margin     float64 `json:"margin"`
	Safe       bool    `json:"safe"`
	// BaseToggles is how many int3 toggles ran at the base wait, all
	// splits together, without a failure; RateBound = 3/BaseToggles, the
	// 95% upper bound on the per-toggle failure rate that this shows.
	BaseToggles int     `json:"base_toggles,omitempty"`
	RateBound   float64 `json:"rate_bound,omitempty"`
	Protocol    string  `json:"protocol"` // Protocol: what WaitNs is for

	Threads         int     `json:"threads"`
	TogglesPerPoint int     `json:"toggles_per_point"`
	Compiler        string  `json:"compiler,omitempty"` // the target's build command and compiler version
	Sweep           []Point `json:"sweep"`
	Date            string  `json:"date"` // RFC 3339, when Run finished
	ElapsedNs       int64   `json:"elapsed_ns,omitempty"`
}

// Wait is the recommended wait (0 if none).
func (r *Result) Wait() time.Duration { return time.Duration(r.WaitNs) }

// Failures sums the failures of every point of a variant.
func (r *Result) Failures(variant string) int {
	n := 0
	for _, p := range r.Sweep {
		if p.Variant == variant {
			n += p.Failures
		}
	}
	return n
}

// ErrNoSafeWait: no positive wait of the int3 sweep had zero failures at it
// and at every larger wait; nothing is saved.
var ErrNoSafeWait = errors.New("no wait of the sweep had zero failures at it and at every larger wait")

func splitName(k int) string {
	if k == 0 {
		return "none"
	}
	return fmt.Sprintf("%d|%d", k, 5-k)
}

func (o Options) normalise() (Options, error) {
	if o.Waits == nil {
		o.Waits = DefaultWaits
	}
	if o.SyncWaits == nil {
		o.SyncWaits = []time.Duration{0}
	}
	var err error
	if o.Waits, err = sortWaits(o.Waits); err != nil {
		return o, err
	}
	if o.SyncWaits, err = sortWaits(o.SyncWaits); err != nil {
		return o, err
	}
	if o.TogglesPerPoint == 0 {
		o.TogglesPerPoint = DefaultToggles
	}
	if o.TogglesPerPoint < 0 {
		return o, fmt.Errorf("calibrate: toggles per point %d < 0", o.TogglesPerPoint)
	}
	o.TogglesPerPoint += o.TogglesPerPoint % 2
	if o.Threads == 0 {
		o.Threads = max(2, runtime.NumCPU())
	}
	if o.Threads < 1 || o.Threads > MaxThreads {
		return o, fmt.Errorf("calibrate: %d executor threads: want 1..%d", o.Threads, MaxThreads)
	}
	if o.Splits == nil {
		o.Splits = DefaultSplits
	}
	seen := map[int]bool{}
	var splits []int
	for _, k := range o.Splits {
		if k < 0 || k > 4 {
			return o, fmt.Errorf("calibrate: split %d: want 0 (no straddle) or 1..4 (K|5-K)", k)
		}
		if !seen[k] {
			seen[k] = true
			splits = append(splits, k)
		}
	}
	if len(splits) == 0 {
		return o, errors.New("calibrate: no splits to test")
	}
	sort.Ints(splits)
	o.Splits = splits
	if o.Margin == 0 {
		o.Margin = DefaultMargin
	}
	if o.Margin < 1 || math.IsNaN(o.Margin) || math.IsInf(o.Margin, 0) {
		return o, fmt.Errorf("calibrate: margin %v: want at least 1", o.Margin)
	}
	return o, nil
}

func sortWaits(ws []time.Duration) ([]time.Duration, error) {
	out := make([]time.Duration, 0, len(ws))
	seen := map[time.Duration]bool{}
	for _, w := range ws {
		if w < 0 {
			return nil, fmt.Errorf("calibrate: wait %v < 0", w)
		}
		if w > time.Second {
			return nil, fmt.Errorf("calibrate: wait %v: more than a second is not a T_max", w)
		}
		if !seen[w] {
			seen[w] = true
			out = append(out, w)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}

// plan lists the sweep's points in the order they run: flip, the int3
// sweep by ascending wait, the int3+sync rows; within each, the splits.
func plan(o Options) []Point {
	var pts []Point
	add := func(variant string, w time.Duration) {
		for _, k := range o.Splits {
			pts = append(pts, Point{Variant: variant, WaitNs: int64(w), Split: splitName(k), Site: k})
		}
	}
	if !o.SkipFlip {
		add(VariantFlip, 0)
	}
	for _, w := range o.Waits {
		add(VariantInt3, w)
	}
	if !o.SkipSync {
		for _, w := range o.SyncWaits {
			add(VariantInt3Sync, w)
		}
	}
	return pts
}

// Run builds the target, runs the sweep and chooses the wait. The result is
// returned even with an error (the points done so far; not Safe unless the
// choice rule is met by them): a cancelled ctx ends the sweep between
// toggles. A failure of the target is data, not an error; errors are what
// stops the sweep (no compiler, no permission to trace, a site in neither
// form, ...).
func Run(ctx context.Context, opts Options) (*Result, error) {
	o, err := opts.normalise()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	res := &Result{
		Version:         Version,
		Machine:         machine(),
		Margin:          o.Margin,
		Protocol:        Protocol,
		Threads:         o.Threads,
		TogglesPerPoint: o.TogglesPerPoint,
	}
	finish := func() {
		res.Machine.LoadEnd = loadavg()
		res.Date = time.Now().UTC().Format(time.RFC3339)
		res.ElapsedNs = int64(time.Since(start))
		res.choose()
	}
	cc, err := findCC(o.CC)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "edgeprobe-calibrate-")
	if err != nil {
		return nil, fmt.Errorf("calibrate: %w", err)
	}
	defer os.RemoveAll(dir)
	prog, err := build(ctx, dir, cc)
	if err != nil {
		return nil, err
	}
	res.Compiler = prog.command

	r := &runner{o: o, prog: prog, start: start}
	defer r.close()
	pts := plan(o)
	for i := range pts {
		p := pts[i]
		err := r.point(ctx, &p, i, len(pts))
		if p.Toggles > 0 || err == nil {
			res.Sweep = append(res.Sweep, p)
		}
		if err != nil {
			finish()
			return res, err
		}
	}
	if r.t != nil {
		if _, err := r.t.stop(); err != nil {
			finish()
			return res, err
		}
	}
	finish()
	return res, nil
}

type runner struct {
	o     Options
	prog  *program
	t     *target
	start time.Time
}

func (r *runner) close() {
	if r.t != nil {
		r.t.kill()
		r.t = nil
	}
}

// ensure returns a live target, traced if the variant needs it.
func (r *runner) ensure(traced bool) (*target, error) {
	if r.t == nil {
		t, err := r.prog.start(r.o.Threads)
		if err != nil {
			return nil, err
		}
		r.t = t
	}
	if traced {
		if err := r.t.attach(); err != nil {
			return nil, err
		}
	}
	return r.t, nil
}

// point runs one point of the sweep.
func (r *runner) point(ctx context.Context, p *Point, idx, total int) error {
	begin := time.Now()
	report := func(done bool) {
		p.ElapsedNs = int64(time.Since(begin))
		if r.o.Progress != nil {
			r.o.Progress(Progress{Point: *p, Index: idx, Total: total, Done: done, Elapsed: time.Since(r.start)})
		}
	}
	report(false)
	traced := p.Variant != VariantFlip
	iopts := xmod.Int3Options{Wait: p.Wait(), NoSync: p.Variant == VariantInt3}
	if iopts.Wait == 0 {
		iopts.Wait = -1 // xmod: negative is no wait, zero its default
	}

	var (
		t          *target
		site       xmod.Site
		torn0      uint64
		bad0       uint64
		rep0       int
		stale0     uint64
		on         = true // the site's form: it starts and ends as the call
		lastReport = time.Now()
	)
	// setup (re)starts the measurement on the current target.
	setup := func() error {
		var err error
		if t, err = r.ensure(traced); err != nil {
			return err
		}
		if site, err = t.site(p.Site, p.Variant == VariantFlip); err != nil {
			return err
		}
		if torn0, bad0, err = t.counters(); err != nil {
			return err
		}
		rep0 = t.log.mark()
		if t.tr != nil {
			stale0 = t.tr.Stats().StaleTraps
		}
		on = true
		return nil
	}
	// crashed records the death of the target and restarts it.
	crashed := func(cause error) error {
		p.Crashes++
		if t.tr != nil {
			p.StaleTraps += t.tr.Stats().StaleTraps - stale0
		}
		how := t.kill()
		n := t.log.count() - rep0
		p.Reported += n
		p.Torn += n // its counter is gone; its reports are what is left
		p.Reports = appendReports(p.Reports, t.log.since())
		p.Reports = append(p.Reports, fmt.Sprintf("target died (%s) after %d toggles of this point: %v; stderr tail: %s", how, p.Toggles, cause, oneLine(t.log.tail())))
		r.t = nil
		return setup()
	}
	if err := setup(); err != nil {
		return err
	}
	for p.Toggles < r.o.TogglesPerPoint {
		if err := ctx.Err(); err != nil {
			return r.endPoint(p, t, torn0, bad0, rep0, stale0, report, err)
		}
		cs := []xmod.Change{{Site: site, On: !on}}
		var err error
		var res xmod.Result
		if p.Variant == VariantFlip {
			var m xmod.Mem = t.mem
			if t.tr != nil {
				m = t.tr
			}
			res, err = xmod.Flip(ctx, m, cs, xmod.FlipOptions{})
			if err != nil && t.tr == nil && ctx.Err() == nil && !dead(err) && t.alive() {
				// A kernel booted with proc_mem.force_override=ptrace
				// lets only the tracer write text: flip through one.
				if aerr := t.attach(); aerr != nil {
					return fmt.Errorf("calibrate: flip on %v: %w (and through a tracer: %v)", site, err, aerr)
				}
				res, err = xmod.Flip(ctx, t.tr, cs, xmod.FlipOptions{})
			}
		} else {
			res, err = xmod.Int3(ctx, t.tr, cs, iopts)
		}
		p.Held += res.Held
		if err != nil {
			if dead(err) || !t.alive() {
				p.Toggles++ // the toggle it died in
				if err := crashed(err); err != nil {
					return err
				}
				continue
			}
			if ctx.Err() != nil {
				return r.endPoint(p, t, torn0, bad0, rep0, stale0, report, ctx.Err())
			}
			return fmt.Errorf("calibrate: %s wait %v on %v after %d toggles: %w", p.Variant, p.Wait(), site, p.Toggles, err)
		}
		on = !on
		p.Toggles++
		if testHook != nil {
			testHook(t, p)
		}
		if p.Toggles%64 == 0 && time.Since(lastReport) >= time.Second {
			lastReport = time.Now()
			report(false)
		}
	}
	return r.endPoint(p, t, torn0, bad0, rep0, stale0, report, nil)
}

const maxReports = 8

// testHook, if set (by tests), runs after every successful toggle.
var testHook func(t *target, p *Point)

// endPoint lets every executor run two more loops, then reads the counters
// into p. If the target died meanwhile, that is a crash of this point.
func (r *runner) endPoint(p *Point, t *target, torn0, bad0 uint64, rep0 int, stale0 uint64, report func(bool), cause error) error {
	ctx := context.Background() // the settle is short and bounded; run it even when cancelled
	err := t.settle(ctx, 30*time.Second)
	var torn, bad uint64
	if err == nil {
		torn, bad, err = t.counters()
	}
	if err != nil {
		if !dead(err) && t.alive() {
			report(true)
			return err
		}
		p.Crashes++
		if t.tr != nil {
			p.StaleTraps += t.tr.Stats().StaleTraps - stale0
		}
		how := t.kill()
		n := t.log.count() - rep0
		p.Reported += n
		p.Torn += n
		p.Reports = appendReports(p.Reports, t.log.since())
		p.Reports = append(p.Reports, fmt.Sprintf("target died (%s) at the end of the point: %v; stderr tail: %s", how, err, oneLine(t.log.tail())))
		r.t = nil
	} else {
		dt := int(torn - torn0)
		p.Torn += dt
		p.Bad += int(bad - bad0)
		t.log.waitCount(rep0+dt, 5*time.Second)
		n := t.log.count() - rep0
		p.Reported += n
		p.Reports = appendReports(p.Reports, t.log.since())
		if t.tr != nil {
			p.StaleTraps += t.tr.Stats().StaleTraps - stale0
		}
	}
	p.Failures = p.Torn + p.Bad + p.Crashes
	report(true)
	return cause
}

func appendReports(have, more []string) []string {
	for _, s := range more {
		if len(have) >= maxReports {
			break
		}
		have = append(have, s)
	}
	return have
}

func oneLine(s string) string {
	s = strings.ReplaceAll(strings.TrimSpace(s), "\n", " | ")
	if len(s) > 300 {
		s = s[len(s)-300:]
	}
	return s
}

// choose applies the rule of the package doc to the int3 rows.
func (r *Result) choose() {
	r.Safe, r.WaitNs, r.BaseWaitNs, r.BaseToggles, r.RateBound = false, 0, 0, 0, 0
	byWait := map[int64][]Point{}
	var waits []int64
	splits := map[string]bool{}
	for _, p := range r.Sweep {
		if p.Variant != VariantInt3 {
			continue
		}
		if _, ok := byWait[p.WaitNs]; !ok {
			waits = append(waits, p.WaitNs)
		}
		byWait[p.WaitNs] = append(byWait[p.WaitNs], p)
		splits[p.Split] = true
	}
	sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
	clean := func(w int64) bool {
		got := map[string]bool{}
		for _, p := range byWait[w] {
			if p.Failures > 0 || p.Toggles < r.TogglesPerPoint {
				return false
			}
			got[p.Split] = true
		}
		return len(got) == len(splits)
	}
	base := int64(-1)
	for i := len(waits) - 1; i >= 0; i-- {
		if !clean(waits[i]) {
			break
		}
		if waits[i] > 0 {
			base = waits[i]
		}
	}
	if base <= 0 {
		return
	}
	r.Safe = true
	r.BaseWaitNs = base
	r.WaitNs = int64(math.Ceil(float64(base) * r.Margin))
	for _, p := range byWait[base] {
		r.BaseToggles += p.Toggles
	}
	if r.BaseToggles > 0 {
		r.RateBound = 3 / float64(r.BaseToggles)
	}
}

// machine describes this machine.
func machine() Machine {
	m := Machine{NProc: runtime.NumCPU(), LoadStart: loadavg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	return m
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
