package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/calibrate"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
	"golang.org/x/sys/unix"
)

// Config sizes every row. Full, Quick and Tiny are the presets.
type Config struct {
	Name           string
	Reps           int           // repetitions of each timed run (median over them)
	ToggleReps     int           // toggles per direction for the flip/int3/stop rows
	AsyncReps      int           // toggles per direction for int3-async and stop
	InvokeN        int64         // calls per invocation/inert run
	InvokeReps     int           // runs of each invocation build (default Reps)
	MicroNs        []int64       // micro-benchmark sizes
	MicroReps      map[int64]int // reps per size (default Reps)
	UprobeMaxN     int64         // largest N run under uprobes
	GdbNs          []int64       // sizes run under gdb
	BatchFuncs     int           // functions of the batch program
	BatchReps      int           // enable+disable passes
	Rates          []int         // toggles/s; 0 means as fast as possible
	Window         time.Duration // throughput measurement window
	Executors      int           // executor threads in the throughput target
	AttachReps     int
	GdbBreaks      int           // breakpoints for the gdb attach figure
	ZlibKB         int           // provider-cost row: zlib workload corpus, KiB
	DemangleN      int           // provider-cost row: names the demangle workload generates
	ProviderPairs  int           // provider-cost row: timed rounds (every variant once each)
	Int3Wait       time.Duration // 0: xmod.DefaultWait (no calibration exists yet)
	SessionToggles int           // row 7: commands per streamed run
	SessionRates   []int         // row 7: toggle rates through the session (0: flat out)
	ArgsN          int           // row 1d: calls per run (100,000 when 0; at most 131,072: every event must fit the ring)
	FilterN        int           // row 1e: calls per run (1,000,000 when 0)
	Rows           map[string]bool
	Log            io.Writer
}

// Full is `make bench`.
func Full() Config {
	return Config{Name: "full", Reps: 7, ToggleReps: 2000, AsyncReps: 300, InvokeN: 20_000_000, InvokeReps: 15,
		MicroNs: []int64{1_000_000, 10_000_000, 100_000_000}, MicroReps: map[int64]int{100_000_000: 3},
		UprobeMaxN: 10_000_000, GdbNs: []int64{1_000, 10_000}, BatchFuncs: 20_000, BatchReps: 7,
		Rates: []int{1_000, 10_000, 100_000, 0}, Window: time.Second, Executors: 1,
		AttachReps: 11, GdbBreaks: 100, ZlibKB: 3072, DemangleN: 200_000, ProviderPairs: 9,
		SessionToggles: 200_000, SessionRates: []int{10_000, 100_000, 0}, ArgsN: 100_000, FilterN: 2_000_000}
}

// Quick is `make bench-quick`: every row, smaller.
func Quick() Config {
	return Config{Name: "quick", Reps: 5, ToggleReps: 300, AsyncReps: 50, InvokeN: 5_000_000,
		MicroNs: []int64{1_000_000}, UprobeMaxN: 1_000_000, GdbNs: []int64{1_000}, BatchFuncs: 2_000,
		BatchReps: 3, Rates: []int{1_000, 10_000, 100_000, 0}, Window: 200 * time.Millisecond,
		Executors: 1, AttachReps: 5, GdbBreaks: 20, ZlibKB: 512, DemangleN: 30_000, ProviderPairs: 3,
		SessionToggles: 50_000, SessionRates: []int{100_000}, ArgsN: 50_000, FilterN: 500_000}
}

// Tiny is the tests' configuration: counts checked, timings meaningless.
func Tiny() Config {
	return Config{Name: "tiny", Reps: 2, ToggleReps: 10, AsyncReps: 4, InvokeN: 10_000,
		MicroNs: []int64{10_000}, UprobeMaxN: 10_000, GdbNs: []int64{50}, BatchFuncs: 200,
		BatchReps: 1, Rates: []int{1_000, 0}, Window: 30 * time.Millisecond, Executors: 1,
		AttachReps: 2, GdbBreaks: 3, ZlibKB: 64, DemangleN: 2_000, ProviderPairs: 1,
		SessionToggles: 200, SessionRates: []int{1_000}, ArgsN: 2_000, FilterN: 2_000}
}

// Rows in run order.
var Rows = []string{"toggle", "invoke", "provider", "batch", "throughput", "micro", "attach", "first", "cli", "session", "args", "filter", "region"}

// Harness runs the rows and collects the report.
type Harness struct {
	Cfg     Config
	B       *Builder
	TSC     TSC
	Rep     *Report
	Runtime string // libedgeprobe.so
	cpus    int

	waitSource string // where Cfg.Int3Wait came from ("" = xmod.DefaultWait)
	realtime   string // row 1b's runs at real-time priority: "yes", "no" (not allowed), "" (not run)
}

// New prepares a harness: calibrates the TSC and builds the runtime.
func New(root, outDir string, cfg Config) (*Harness, error) {
	b, err := NewBuilder(root, filepath.Join(outDir, "build"))
	if err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	h := &Harness{Cfg: cfg, B: b, cpus: runtime.NumCPU()}
	h.TSC = CalibrateTSC(5, 20*time.Millisecond)
	h.Rep = newReport(cfg, h.TSC)
	rt, err := b.Build("libedgeprobe.so", "gcc", []string{"-O2", "-g", "-fPIC", "-shared", "-fno-plt", "-pthread",
		"-ftls-model=initial-exec", "-fvisibility=hidden"}, runtimeSources(root)...)
	if err != nil {
		return nil, fmt.Errorf("building the runtime: %w", err)
	}
	h.Runtime = rt
	h.loadCalibration()
	// Uprobes a killed harness left enabled would slow every run of the
	// uninstrumented micro build: remove them before anything is measured.
	if os.Geteuid() == 0 {
		newUprobes(h).available()
	}
	return h, nil
}

// runtimeSources are the runtime's C and assembly files, as the Makefile
// builds bin/libedgeprobe.so (runtime/*.c and runtime/*.S), relative to root;
// none when root has no runtime (the build then fails and says so).
func runtimeSources(root string) []string {
	var srcs []string
	for _, pat := range []string{"runtime/*.c", "runtime/*.S"} {
		m, _ := filepath.Glob(filepath.Join(root, pat))
		for _, p := range m {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				rel = p
			}
			srcs = append(srcs, rel)
		}
	}
	return srcs
}

// loadCalibration takes the int3 wait from internal/calibrate's saved
// calibration when there is one and no -int3-wait was given.
func (h *Harness) loadCalibration() {
	path := calibrate.DefaultPath()
	if h.Cfg.Int3Wait != 0 {
		h.Rep.Skip("calibrate.wait_ns", "the int3 wait was set by hand (-int3-wait "+h.Cfg.Int3Wait.String()+"); the calibration was not consulted")
		h.waitSource = "-int3-wait"
		return
	}
	d, ok, err := calibrate.Load("")
	switch {
	case err != nil:
		h.Rep.Skip("calibrate.wait_ns", "the calibration at "+path+" cannot be read ("+err.Error()+"); the int3 rows use xmod.DefaultWait")
	case !ok:
		h.Rep.Skip("calibrate.wait_ns", "no calibration saved at "+path+" (run the calibration, internal/calibrate, first); the int3 rows use xmod.DefaultWait ("+xmod.DefaultWait.String()+")")
	default:
		h.Cfg.Int3Wait = d
		if d == 0 {
			h.Cfg.Int3Wait = -1 // xmod: negative means no wait
		}
		h.waitSource = "calibration " + path
		h.Rep.Set("calibrate.wait_ns", float64(d.Nanoseconds()))
	}
}

func (h *Harness) logf(format string, args ...any) {
	fmt.Fprintf(h.Cfg.Log, "bench: "+format+"\n", args...)
}

// Run runs every selected row; a row that fails is reported as skipped with
// its error, and the others still run.
func (h *Harness) Run(ctx context.Context) {
	start := time.Now()
	fns := map[string]func(context.Context) error{
		"toggle": h.RunToggle, "invoke": h.RunInvoke, "provider": h.RunProvider, "batch": h.RunBatch,
		"throughput": h.RunThroughput, "micro": h.RunMicro, "attach": h.RunAttach, "first": h.RunFirstRecord, "cli": h.RunCLI,
		"session": h.RunSession, "args": h.RunArgs, "filter": h.RunFilter, "region": h.RunRegion,
	}
	for _, r := range Rows {
		if h.Cfg.Rows != nil && !h.Cfg.Rows[r] {
			continue
		}
		t0 := time.Now()
		h.logf("row %s ...", r)
		if err := fns[r](ctx); err != nil {
			h.Rep.Skip("row."+r, "failed: "+err.Error())
			h.logf("row %s failed: %v", r, err)
		}
		h.Rep.Meta.RowSeconds[r] = time.Since(t0).Seconds()
		h.logf("row %s done in %.1fs", r, time.Since(t0).Seconds())
	}
	h.table2()
	h.Rep.Meta.Seconds = time.Since(start).Seconds()
	h.Rep.Commands = h.B.Commands()
}

// targetCPU is where targets' executor threads go, harnessCPU where the
// harness's toggling thread goes: different cores when there are two.
func (h *Harness) targetCPU() int {
	if h.cpus >= 2 {
		return 1
	}
	return -1
}

// pinHarness locks the goroutine to its thread and pins the thread to CPU 0
// (when the target has its own core); the returned function undoes both.
func (h *Harness) pinHarness() func() {
	runtime.LockOSThread()
	if h.cpus < 2 {
		return runtime.UnlockOSThread
	}
	var old, set unix.CPUSet
	_ = unix.SchedGetaffinity(0, &old)
	set.Set(0)
	_ = unix.SchedSetaffinity(0, &set)
	return func() {
		_ = unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	}
}

// Loadavg returns /proc/loadavg's first three fields.
func Loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	var a, c, d string
	fmt.Sscan(string(b), &a, &c, &d)
	return a + " " + c + " " + d
}

func sortedKeys[M ~map[string]V, V any](m M) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
