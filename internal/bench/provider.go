package bench

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"golang.org/x/sys/unix"
)

// BinutilsTarball is where Debian's binutils-source package puts the
// binutils 2.40 sources; the provider-cost row builds its real workloads
// (zlib 1.2.13 and libiberty) from it.
const BinutilsTarball = "/usr/src/binutils/binutils-2.40.tar.xz"

var binutilsTarball = BinutilsTarball // tests point it elsewhere

// ProviderResult is one (workload, variant) cell of the provider-cost row.
type ProviderResult struct {
	Workload  string  `json:"workload"`
	Variant   string  `json:"variant"` // the provider_cost key
	Name      string  `json:"name"`
	CPU       Summary `json:"cpu"`          // user+sys CPU time per run (rusage of the child)
	Overhead  Summary `json:"overhead_pct"` // paired (variant - uninstrumented) / uninstrumented * 100
	Cold      bool    `json:"cold"`         // every hook site inert: must reach no hook
	HookCalls uint64  `json:"hook_calls"`   // hooks reached by one run (counting preload or the runtime)
	// PerHook is the paired CPU difference per hook call, in ns: against
	// the uninstrumented run, or for the runtime's variants against the
	// uninstrumented build under the runtime (its start-up taken out).
	PerHook    Summary `json:"per_hook"`
	HookText   string  `json:"hooks"`
	SameOutput bool    `json:"same_output"` // every run printed the uninstrumented build's output
	Skip       string  `json:"skip,omitempty"`
}

// pcWorkload is one real program of the row: a driver of our own (bench/)
// linked with a library from the binutils sources compiled per variant.
type pcWorkload struct {
	key, title, what string
	dir              string   // under binutils-2.40
	files            []string // the library's compilation units
	flags            []string // compile flags of driver and library (defines, includes)
	driver           string
	args             []string
}

func (h *Harness) providerWorkloads(src string) []*pcWorkload {
	return []*pcWorkload{
		{key: "zlib", title: "zlib 1.2.13", dir: "zlib", driver: "bench/zlibwork.c",
			what:  fmt.Sprintf("bench/zlibwork.c: deflate + inflate of a %d KiB generated text-like corpus at levels 1, 6, 9, round trip checked", h.Cfg.ZlibKB),
			files: []string{"adler32", "compress", "crc32", "deflate", "infback", "inffast", "inflate", "inftrees", "trees", "uncompr", "zutil"},
			flags: []string{"-I", filepath.Join(src, "zlib")}, args: []string{strconv.Itoa(h.Cfg.ZlibKB)}},
		{key: "demangle", title: "libiberty (cp-demangle, hashtab, splay-tree, md5)", dir: "libiberty", driver: "bench/demanglework.c",
			what:  fmt.Sprintf("bench/demanglework.c: %d generated C++ symbols demangled by cp-demangle.c, interned in a hashtab, counted in a splay tree, digested with md5", h.Cfg.DemangleN),
			files: []string{"cp-demangle", "hashtab", "splay-tree", "md5", "safe-ctype"},
			flags: []string{"-DHAVE_STDLIB_H", "-DHAVE_STRING_H", "-DHAVE_LIMITS_H", "-DHAVE_STDINT_H", "-DSTDC_HEADERS", "-I", filepath.Join(src, "include")},
			args:  []string{strconv.Itoa(h.Cfg.DemangleN)}},
	}
}

// pcConfigs are the library's compile configurations; the link never has -pg.
var pcConfigs = []struct{ name, text string }{
	{"plain", ""}, {"cyg", "-finstrument-functions"}, {"fentry", "-pg -mfentry"},
}

// ProviderKeys are the provider_cost variants, in table order.
var ProviderKeys = []string{"runtime_startup", "cyg_nop", "cyg_flip", "fentry_flip", "fentry_nop",
	"cyg_glibc", "cyg_runtime_count", "cyg_runtime", "fentry_glibc", "fentry_empty", "fentry_runtime_entry", "fentry_runtime"}

// extractBinutils unpacks the parts of the binutils tarball the row builds
// into the build directory (once), returning binutils-2.40's path.
func (h *Harness) extractBinutils() (string, error) {
	dir := filepath.Join(h.B.Dir, "binutils-2.40")
	stamp := filepath.Join(dir, ".edgeprobe-extracted")
	parts := []string{"binutils-2.40/zlib", "binutils-2.40/libiberty", "binutils-2.40/include"}
	line := "tar -xJf " + binutilsTarball + " " + strings.Join(parts, " ")
	h.B.record(line)
	if _, err := os.Stat(stamp); err == nil {
		return dir, nil
	}
	cmd := exec.Command("tar", append([]string{"-xJf", binutilsTarball, "-C", h.B.Dir}, parts...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%s: %v %s", line, err, out)
	}
	return dir, os.WriteFile(stamp, nil, 0o644)
}

// buildWorkload compiles the driver once and the library in each
// configuration (objects under build/provider, two compilers at a time),
// and links one binary per configuration.
func (h *Harness) buildWorkload(w *pcWorkload, src string) (map[string]string, error) {
	ob, err := NewBuilder(h.B.Root, filepath.Join(h.B.Dir, "provider"))
	if err != nil {
		return nil, err
	}
	base := append([]string{"-O2", "-g"}, w.flags...)
	driver, err := ob.Build(w.key+"-driver.o", "gcc", append(append([]string(nil), base...), "-c"), w.driver)
	if err != nil {
		return nil, err
	}
	bins := map[string]string{}
	for _, c := range pcConfigs {
		args := append([]string(nil), base...)
		args = append(args, strings.Fields(c.text)...)
		args = append(args, "-c")
		objs := make([]string, len(w.files))
		errs := make([]error, len(w.files))
		sem := make(chan struct{}, 2)
		var wg sync.WaitGroup
		for i, f := range w.files {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				objs[i], errs[i] = ob.Build(fmt.Sprintf("%s-%s-%s.o", w.key, c.name, f), "gcc", args, filepath.Join(src, w.dir, f+".c"))
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		name := w.key + "-" + c.name
		bin, err := ob.Build(name, "gcc", []string{"-O2", "-g"}, append([]string{driver}, objs...)...)
		if err != nil {
			return nil, err
		}
		bins[c.name] = bin
		flags := strings.Join(w.flags, " ")
		flags = strings.ReplaceAll(flags, src+"/", "binutils-2.40/")
		h.B.record(fmt.Sprintf("gcc -O2 -g %s %s -c binutils-2.40/%s/{%s}.c && gcc -O2 -g %s -c %s && gcc -O2 -g <driver and library objects> -o %s (no -pg at link)",
			flags, c.text, w.dir, strings.Join(w.files, ","), flags, w.driver, name))
	}
	return bins, nil
}

// runtimeHasFentry reports whether the built runtime defines __fentry__.
func runtimeHasFentry(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		return false
	}
	for _, s := range syms {
		if s.Name == "__fentry__" && s.Section != elf.SHN_UNDEF {
			return true
		}
	}
	return false
}

// pcRun is one run's outcome.
type pcRun struct {
	cpuNs          float64
	out            string
	entries, exits uint64 // the runtime's counts, when it was preloaded
}

// runCPU runs bin to completion and returns the child's user+sys CPU time.
func (h *Harness) runCPU(ctx context.Context, bin string, args, env []string, withRuntime bool) (pcRun, error) {
	var outFile string
	if withRuntime {
		outFile = tempFile(h.B.Dir, "ep-out-*")
		defer os.Remove(outFile)
		env = append(append([]string(nil), env...), "LD_PRELOAD="+h.Runtime, "EDGEPROBE_OUTPUT="+outFile, "EDGEPROBE_QUIET=1")
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return pcRun{}, fmt.Errorf("%s %s: %v %s", filepath.Base(bin), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	ps := cmd.ProcessState
	r := pcRun{cpuNs: float64((ps.UserTime() + ps.SystemTime()).Nanoseconds()), out: stdout.String()}
	if withRuntime {
		var err error
		if r.entries, r.exits, err = runtimeCounts(outFile); err != nil {
			return r, err
		}
	}
	return r, nil
}

// hookCounts runs bin once under bench/hookcount.c and returns what it
// counted: cyg entries and exits, fentry calls.
func (h *Harness) hookCounts(ctx context.Context, bin, counter string, args []string) (cygIn, cygOut, fentry uint64, out string, err error) {
	f := tempFile(h.B.Dir, "hookcount-*")
	defer os.Remove(f)
	r, err := h.runCPU(ctx, bin, args, []string{"LD_PRELOAD=" + counter, "HOOKCOUNT_OUT=" + f}, false)
	if err != nil {
		return 0, 0, 0, "", err
	}
	b, err := os.ReadFile(f)
	if err != nil {
		return 0, 0, 0, "", fmt.Errorf("the counting preload wrote nothing (%v): did it load?", err)
	}
	kv := parseKV(string(b))
	return uint64(kv["cyg_enter"]), uint64(kv["cyg_exit"]), uint64(kv["fentry"]), r.out, nil
}

// pinChild pins the calling thread, and so every child it starts, to the
// target CPU; the returned function undoes it.
func (h *Harness) pinChild() func() {
	runtime.LockOSThread()
	cpu := h.targetCPU()
	if cpu < 0 {
		return runtime.UnlockOSThread
	}
	var old, set unix.CPUSet
	_ = unix.SchedGetaffinity(0, &old)
	set.Set(cpu)
	_ = unix.SchedSetaffinity(0, &set)
	return func() {
		_ = unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	}
}

// realtimePriority is the SCHED_FIFO priority of row 1b's runs: above every
// normal task, below the kernel's own real-time threads (priority 50 and up).
const realtimePriority = 10

// pinChildRealtime puts the calling thread, which pinChild locked, at
// SCHED_FIFO realtimePriority, so that the next child it starts inherits it;
// the returned function restores the thread's policy. Where the harness may
// not (no CAP_SYS_NICE), the runs stay at normal priority and row 1b says so.
func (h *Harness) pinChildRealtime() func() {
	old, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		h.realtime = "no"
		return func() {}
	}
	rt := unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: realtimePriority}
	if err := unix.SchedSetAttr(0, &rt, 0); err != nil {
		if h.realtime == "" {
			h.logf("row 1b at normal priority: sched_setattr: %v", err)
		}
		h.realtime = "no"
		return func() {}
	}
	if h.realtime == "" {
		h.realtime = "yes"
	}
	return func() { _ = unix.SchedSetAttr(0, old, 0) }
}

// realtimeNote is row 1b's word on the priority its runs had.
func (h *Harness) realtimeNote() string {
	switch h.realtime {
	case "yes":
		return fmt.Sprintf(" at real-time priority (SCHED_FIFO %d)", realtimePriority)
	case "no":
		return " at normal priority (the harness may not set a real-time one)"
	}
	return ""
}

// pcVariant is one build and environment of a workload.
type pcVariant struct {
	key, name string
	bin       string
	env       []string
	rt        bool   // the edgeprobe runtime is preloaded (counts from its output)
	cold      bool   // every site inert
	provider  string // the hooks the binary calls: "cyg", "fentry" or ""
	exits     bool   // exits are expected to be counted
	optional  bool   // a failure is reported, not fatal to the row
	skip      string
	cpu       []float64
	hooks     uint64
	hookText  string
}

// RunProvider is row 1c: the inert and active cost of each provider on
// real programs, CPU time over paired, interleaved runs.
func (h *Harness) RunProvider(ctx context.Context) error {
	sec := Section{Title: "1c. Inert and active cost by provider on a real workload",
		Head: []string{"workload", "variant", "CPU per run", "vs uninstrumented (paired)", "hooks reached per run", "per hook call", "note"}}
	if _, err := os.Stat(binutilsTarball); err != nil {
		reason := "not measured: binutils-source not installed (" + binutilsTarball + " is missing; apt-get install binutils-source, or benchreport -setup)"
		h.skipProviderKeys(reason)
		sec.Text = reason
		h.Rep.Add(sec)
		return nil
	}
	env, err := h.providerSetup()
	if err != nil {
		return err
	}
	var errs []string
	worst := providerWorst{}
	workloads := h.providerWorkloads(env.src)
	for _, w := range workloads {
		t0 := time.Now()
		res, err := h.runWorkload(ctx, w, env)
		h.logf("provider %s: %.1fs", w.key, time.Since(t0).Seconds())
		if err != nil {
			errs = append(errs, w.key+": "+err.Error())
		}
		h.reportWorkload(&sec, w, res, err, worst)
	}
	h.reportProviderTotals(workloads, worst)
	sec.Text = providerText(h.targetCPU(), h.Cfg.ProviderPairs)
	sec.Foot = h.providerVerdict(workloads)
	h.Rep.Add(sec)
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// providerText is the section's description.
func providerText(cpu, pairs int) string {
	return fmt.Sprintf("Real C libraries from Debian's binutils-source (binutils 2.40's bundled zlib 1.2.13 and libiberty), each built gcc -O2 -g three ways: uninstrumented, `-finstrument-functions` (cyg) and `-pg -mfentry` at compile time only (fentry; the link has no `-pg`), with our own driver (bench/zlibwork.c, bench/demanglework.c) left uninstrumented, so the variants differ in the library's code alone. "+
		"The cold variants are coldpatch's output for the cyg and fentry builds (flip: `e8`->`3d`, one byte; nop: a multi-byte NOP). The active variants run the instrumented builds unpatched: with glibc's hooks (`__cyg_profile_func_*` are a bare `ret`; glibc's `__fentry__` is not: it saves the argument registers and calls `__mcount_internal`, which returns at once without gmon), with an empty preloaded `__fentry__` (bench/emptyfentry.c, a bare `ret`), and under the edgeprobe runtime (LD_PRELOAD, count-only `EDGEPROBE_TIMING=0` and the timed default; for fentry, entries only `EDGEPROBE_FENTRY_EXITS=0` and entries plus return-address-hijacking exits). "+
		"CPU = user+sys of the child (rusage), %s; %d rounds after a checking round, every variant run once per round in a rotating order, and each variant's overhead is the median (p10..p90) of its per-round ratio against the uninstrumented run of the same round. "+
		"Checks, every time the row runs: every run's output (the workload's checksums) equals the uninstrumented build's; under a counting preload (bench/hookcount.c) the cold builds reach no hook and the active ones reach theirs; the runtime counts as many entries as the counting preload (and as many exits, for cyg and fentry with exits). "+
		"Per hook call (one entry or one exit) = the paired CPU difference divided by the hooks the run reached: against the uninstrumented run, and for the runtime's variants against the uninstrumented build under the runtime (the runtime's start-up and exit, which no hook pays for, taken out). "+
		"`provider_cost.<variant>` in results.json is the larger of the two workloads' median overheads (percent); `provider_cost.<workload>.<variant>` are per workload. Not measured here: clang builds.",
		pinText(cpu), pairs)
}

func (h *Harness) skipProviderKeys(reason string) {
	for _, k := range ProviderKeys {
		h.Rep.Skip("provider_cost."+k, reason)
	}
}

// providerEnv is what every workload shares: the extracted sources, the
// counting preload, the empty __fentry__ and whether the runtime has one.
type providerEnv struct {
	src, counter, emptyFentry string
	rtFentry                  bool
}

func (h *Harness) providerSetup() (*providerEnv, error) {
	src, err := h.extractBinutils()
	if err != nil {
		h.skipProviderKeys("not measured: " + err.Error())
		return nil, err
	}
	e := &providerEnv{src: src, rtFentry: runtimeHasFentry(h.Runtime)}
	if e.counter, err = h.B.Build("libhookcount.so", "gcc", []string{"-O2", "-g", "-shared", "-fPIC"}, "bench/hookcount.c"); err != nil {
		return nil, err
	}
	if e.emptyFentry, err = h.B.Build("libemptyfentry.so", "gcc", []string{"-O2", "-g", "-shared", "-fPIC"}, "bench/emptyfentry.c"); err != nil {
		return nil, err
	}
	return e, nil
}

// providerWorst is each variant's largest median overhead over the
// workloads.
type providerWorst map[string]float64

// reportWorkload adds one workload's rows and figures (or its failure).
func (h *Harness) reportWorkload(sec *Section, w *pcWorkload, res []ProviderResult, err error, worst providerWorst) {
	if err != nil {
		for _, k := range ProviderKeys {
			h.Rep.Skip("provider_cost."+w.key+"."+k, "failed: "+err.Error())
		}
		sec.Rows = append(sec.Rows, []string{w.title, "-", "failed: " + firstLine(err.Error()), "", "", "", ""})
		return
	}
	for i, r := range res {
		h.Rep.Provider = append(h.Rep.Provider, r)
		row := []string{"", r.Name, "", "", r.HookText, "", ""}
		if i == 0 {
			row[0] = w.title
			row[6] = w.what
		}
		if r.PerHook.N > 0 {
			row[5] = fmtNs(r.PerHook.MedianNs)
			h.Rep.Stats["provider_hook_ns."+w.key+"."+r.Variant] = r.PerHook
		}
		key := "provider_cost." + w.key + "." + r.Variant
		switch {
		case r.Skip != "":
			row[2] = "not measured: " + r.Skip
			if r.Variant != "uninstrumented" {
				h.Rep.Skip(key, "not measured: "+r.Skip)
			}
		default:
			row[2] = fmtCPU(r.CPU)
			h.Rep.Stats["provider_cost_detail."+w.key+"."+r.Variant] = r.CPU
			if r.Variant != "uninstrumented" {
				row[3] = fmt.Sprintf("%+.1f%% (%+.1f..%+.1f)", r.Overhead.MedianNs, r.Overhead.P10Ns, r.Overhead.P90Ns)
				h.Rep.Set(key, r.Overhead.MedianNs)
				if old, ok := worst[r.Variant]; !ok || r.Overhead.MedianNs > old {
					worst[r.Variant] = r.Overhead.MedianNs
				}
			}
		}
		sec.Rows = append(sec.Rows, row)
	}
}

// reportProviderTotals sets provider_cost.<variant>: the worst workload's
// overhead, or why no workload measured it.
func (h *Harness) reportProviderTotals(workloads []*pcWorkload, worst providerWorst) {
	for _, k := range ProviderKeys {
		if v, ok := worst[k]; ok {
			h.Rep.Set("provider_cost."+k, v)
			continue
		}
		why := "no workload measured it"
		for _, w := range workloads {
			if r, ok := h.Rep.Skipped["provider_cost."+w.key+"."+k]; ok {
				why = r
				break
			}
		}
		h.Rep.Skip("provider_cost."+k, why)
	}
}

func pinText(cpu int) string {
	if cpu < 0 {
		return "not pinned (one CPU)"
	}
	return fmt.Sprintf("each child pinned to CPU %d", cpu)
}

func fmtCPU(s Summary) string {
	if s.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%s (%s-%s)", fmtNs(s.MedianNs), fmtNs(s.P10Ns), fmtNs(s.P90Ns))
}

// runWorkload builds one workload's variants, checks them, and times them.
func (h *Harness) runWorkload(ctx context.Context, w *pcWorkload, env *providerEnv) ([]ProviderResult, error) {
	vs, err := h.workloadVariants(w, env)
	if err != nil {
		return nil, err
	}
	base, err := h.checkVariants(ctx, w, vs, env.counter)
	if err != nil {
		return nil, err
	}
	if err := h.timeVariants(ctx, w, vs, base); err != nil {
		return nil, err
	}
	return h.providerResults(w, vs), nil
}

// workloadVariants builds the workload (uninstrumented, cyg, fentry), the
// cold copies of each provider's build, and lists every variant.
func (h *Harness) workloadVariants(w *pcWorkload, env *providerEnv) ([]*pcVariant, error) {
	bins, err := h.buildWorkload(w, env.src)
	if err != nil {
		return nil, err
	}
	cold := map[string]string{}
	for _, c := range []struct{ prov, ph string }{{"cyg", probelist.PlaceholderNop}, {"cyg", probelist.PlaceholderFlip}, {"fentry", probelist.PlaceholderFlip}, {"fentry", probelist.PlaceholderNop}} {
		name := w.key + "-" + c.prov + "-" + c.ph
		out, list, err := h.B.Cold(bins[c.prov], name, c.ph)
		if err != nil {
			return nil, err
		}
		for _, p := range list.Probes {
			if p.Provider != c.prov {
				return nil, fmt.Errorf("%s: probe %d at %s is provider %q, want %q only", name, p.ID, p.Address, p.Provider, c.prov)
			}
		}
		cold[c.prov+"_"+c.ph] = out
	}
	noFentry := ""
	if !env.rtFentry {
		noFentry = "runtime has no __fentry__ yet (" + filepath.Base(h.Runtime) + " built from runtime/ defines none)"
	}
	vs := []*pcVariant{
		{key: "uninstrumented", name: "uninstrumented", bin: bins["plain"]},
		{key: "runtime_startup", name: "uninstrumented, edgeprobe runtime preloaded (its start-up and exit alone)", bin: bins["plain"], rt: true},
		{key: "cyg_nop", name: "cyg, inert (nop placeholder)", bin: cold["cyg_nop"], cold: true, provider: "cyg"},
		{key: "cyg_flip", name: "cyg, inert (flip placeholder)", bin: cold["cyg_flip"], cold: true, provider: "cyg"},
		{key: "fentry_flip", name: "fentry, inert (flip placeholder)", bin: cold["fentry_flip"], cold: true, provider: "fentry"},
		{key: "fentry_nop", name: "fentry, inert (nop placeholder)", bin: cold["fentry_nop"], cold: true, provider: "fentry"},
		{key: "cyg_glibc", name: "cyg, active: glibc's empty hooks", bin: bins["cyg"], provider: "cyg", exits: true},
		{key: "cyg_runtime_count", name: "cyg, active: edgeprobe runtime, count only", bin: bins["cyg"], env: []string{"EDGEPROBE_TIMING=0"}, rt: true, provider: "cyg", exits: true},
		{key: "cyg_runtime", name: "cyg, active: edgeprobe runtime (count + latency)", bin: bins["cyg"], rt: true, provider: "cyg", exits: true},
		{key: "fentry_glibc", name: "fentry, active: glibc's __fentry__", bin: bins["fentry"], provider: "fentry"},
		{key: "fentry_empty", name: "fentry, active: empty preloaded __fentry__", bin: bins["fentry"], env: []string{"LD_PRELOAD=" + env.emptyFentry}, provider: "fentry"},
		{key: "fentry_runtime_entry", name: "fentry, active: edgeprobe runtime, entries only", bin: bins["fentry"], env: []string{"EDGEPROBE_FENTRY_EXITS=0"}, rt: true, provider: "fentry", optional: true, skip: noFentry},
		{key: "fentry_runtime", name: "fentry, active: edgeprobe runtime, entries + exits (count + latency)", bin: bins["fentry"], rt: true, provider: "fentry", exits: true, optional: true, skip: noFentry},
	}
	return vs, nil
}

// checkVariants is the checking round: the uninstrumented output, then each
// variant's output and the hooks it reaches (an optional variant that fails
// is marked skipped). It returns the uninstrumented run.
func (h *Harness) checkVariants(ctx context.Context, w *pcWorkload, vs []*pcVariant, counter string) (pcRun, error) {
	base, err := h.runCPU(ctx, vs[0].bin, w.args, nil, false)
	if err != nil {
		return base, err
	}
	if !strings.HasPrefix(lastLine(base.out), "ok ") {
		return base, fmt.Errorf("uninstrumented %s printed no ok line: %q", w.key, base.out)
	}
	counted := map[string][3]uint64{} // binary -> cyg enter, cyg exit, fentry under the counting preload
	for _, v := range vs {
		if v.skip != "" {
			continue
		}
		if err := h.checkVariant(ctx, w, v, base.out, counter, counted); err != nil {
			if !v.optional {
				return base, fmt.Errorf("%s: %w", v.key, err)
			}
			v.skip = "failed its check: " + firstLine(err.Error())
		}
	}
	return base, nil
}

// timeVariants runs the timed rounds, pinned, the order rotating round by
// round; every run's output must equal the uninstrumented one's.
func (h *Harness) timeVariants(ctx context.Context, w *pcWorkload, vs []*pcVariant, base pcRun) error {
	var live []*pcVariant
	for _, v := range vs {
		if v.skip == "" {
			live = append(live, v)
		}
	}
	unpin := h.pinChild()
	defer unpin()
	for r := 0; r < h.Cfg.ProviderPairs; r++ {
		for j := range live {
			v := live[(j+r)%len(live)]
			run, err := h.runCPU(ctx, v.bin, w.args, v.env, v.rt)
			if err != nil {
				return fmt.Errorf("%s: %w", v.key, err)
			}
			if run.out != base.out {
				return fmt.Errorf("%s: output differs from the uninstrumented build's:\n%s\nwant\n%s", v.key, run.out, base.out)
			}
			v.cpu = append(v.cpu, run.cpuNs)
		}
	}
	return nil
}

// providerResults turns each variant's runs into its result: CPU, paired
// overhead against the uninstrumented build, and cost per hook reached.
func (h *Harness) providerResults(w *pcWorkload, vs []*pcVariant) []ProviderResult {
	var startup *pcVariant
	if vs[1].key == "runtime_startup" && vs[1].skip == "" {
		startup = vs[1]
	}
	var res []ProviderResult
	for _, v := range vs {
		r := ProviderResult{Workload: w.key, Variant: v.key, Name: v.name, Cold: v.cold, HookCalls: v.hooks, HookText: v.hookText, Skip: v.skip}
		if v.skip == "" {
			r.SameOutput = true
			r.CPU = Summarize(v.cpu, h.TSC)
			if v != vs[0] {
				pct := make([]float64, len(v.cpu))
				for i := range pct {
					pct[i] = (v.cpu[i] - vs[0].cpu[i]) / vs[0].cpu[i] * 100
				}
				r.Overhead = Summarize(pct, TSC{})
			}
			ref := vs[0]
			if v.rt {
				ref = startup
			}
			if v.hooks > 0 && ref != nil {
				per := make([]float64, len(v.cpu))
				for i := range per {
					per[i] = (v.cpu[i] - ref.cpu[i]) / float64(v.hooks)
				}
				r.PerHook = Summarize(per, h.TSC)
			}
		}
		res = append(res, r)
	}
	return res
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// checkVariant runs v once: its output must equal the uninstrumented one;
// the hooks it reaches are counted (the counting preload for the builds,
// the runtime's own counts when it is preloaded, checked against the
// preload's count of the same binary).
func (h *Harness) checkVariant(ctx context.Context, w *pcWorkload, v *pcVariant, want, counter string, counted map[string][3]uint64) error {
	c, ok := counted[v.bin]
	if !ok && v.key != "uninstrumented" {
		ci, co, fe, out, err := h.hookCounts(ctx, v.bin, counter, w.args)
		if err != nil {
			return err
		}
		if out != want {
			return fmt.Errorf("under the counting preload the output differs from the uninstrumented build's: %q", out)
		}
		c = [3]uint64{ci, co, fe}
		counted[v.bin] = c
	}
	run, err := h.runCPU(ctx, v.bin, w.args, v.env, v.rt)
	if err != nil {
		return err
	}
	if run.out != want {
		return fmt.Errorf("output differs from the uninstrumented build's:\n%s\nwant\n%s", run.out, want)
	}
	switch {
	case v.provider == "":
		if run.entries+run.exits != 0 {
			return fmt.Errorf("the runtime counted %d entries and %d exits in a build without sites", run.entries, run.exits)
		}
		v.hookText = "none (no sites)"
	case v.cold:
		if c != [3]uint64{} {
			return fmt.Errorf("cold build reached hooks: cyg %d/%d, fentry %d", c[0], c[1], c[2])
		}
		v.hookText = "0 (counting preload)"
	case v.rt:
		var wantIn, wantOut uint64
		if v.provider == "cyg" {
			wantIn, wantOut = c[0], c[1]
		} else {
			wantIn, wantOut = c[2], 0
			if v.exits {
				wantOut = c[2]
			}
		}
		if run.entries != wantIn || run.exits != wantOut || wantIn == 0 {
			return fmt.Errorf("the runtime counted %d entries and %d exits, the counting preload %d calls (want %d exits)", run.entries, run.exits, wantIn, wantOut)
		}
		v.hooks = run.entries + run.exits
		v.hookText = fmt.Sprintf("%s entries, %s exits (runtime)", fmtBig(run.entries), fmtBig(run.exits))
	default:
		switch v.provider {
		case "cyg":
			if c[0] == 0 || c[0] != c[1] || c[2] != 0 {
				return fmt.Errorf("counting preload: cyg %d entries / %d exits, fentry %d", c[0], c[1], c[2])
			}
			v.hooks = c[0] + c[1]
			v.hookText = fmt.Sprintf("%s enter + %s exit calls (counting preload)", fmtBig(c[0]), fmtBig(c[1]))
		case "fentry":
			if c[2] == 0 || c[0]+c[1] != 0 {
				return fmt.Errorf("counting preload: fentry %d, cyg %d/%d", c[2], c[0], c[1])
			}
			v.hooks = c[2]
			v.hookText = fmt.Sprintf("%s __fentry__ calls (counting preload)", fmtBig(c[2]))
		}
	}
	return nil
}

func fmtBig(n uint64) string {
	if n < 10000 {
		return strconv.FormatUint(n, 10)
	}
	return fmt.Sprintf("%.3g", float64(n))
}

// providerVerdict sets this run's figures side by side, workload by
// workload, and says whether they favour the fentry provider. A difference
// whose p10..p90 ranges overlap counts as a tie, not a win.
func (h *Harness) providerVerdict(ws []*pcWorkload) string {
	cell := map[string]ProviderResult{}
	for _, r := range h.Rep.Provider {
		cell[r.Workload+"."+r.Variant] = r
	}
	get := func(wl, k string) (Summary, bool) {
		r, ok := cell[wl+"."+k]
		return r.Overhead, ok && r.Skip == "" && r.Overhead.N > 0
	}
	// cmp: -1 a clearly below b, 1 clearly above, 0 the spreads overlap.
	cmp := func(a, b Summary) int {
		switch {
		case a.P90Ns < b.P10Ns:
			return -1
		case a.P10Ns > b.P90Ns:
			return 1
		}
		return 0
	}
	pc := func(s Summary) string { return fmt.Sprintf("%+.1f%%", s.MedianNs) }
	var parts []string
	inertWorse, activeWorse, inertBetter, activeBetter, compared := 0, 0, 0, 0, 0
	for _, w := range ws {
		cf, ok1 := get(w.key, "cyg_flip")
		cn, ok2 := get(w.key, "cyg_nop")
		ff, ok3 := get(w.key, "fentry_flip")
		cg, ok4 := get(w.key, "cyg_glibc")
		fe, ok5 := get(w.key, "fentry_empty")
		if !(ok1 && ok2 && ok3 && ok4 && ok5) {
			continue
		}
		compared++
		bestCyg := cf
		if cn.MedianNs < cf.MedianNs {
			bestCyg = cn
		}
		switch cmp(ff, bestCyg) {
		case -1:
			inertBetter++
		case 1:
			inertWorse++
		}
		switch cmp(fe, cg) {
		case -1:
			activeBetter++
		case 1:
			activeWorse++
		}
		p := fmt.Sprintf("%s: inert fentry (flip) %s against inert cyg %s (flip) / %s (nop); active with empty hooks fentry %s against cyg %s", w.key, pc(ff), pc(cf), pc(cn), pc(fe), pc(cg))
		if rc, ok := get(w.key, "cyg_runtime_count"); ok {
			if re, ok := get(w.key, "fentry_runtime_entry"); ok {
				p += fmt.Sprintf("; under the runtime, fentry entries only %s against cyg counting entries and exits %s", pc(re), pc(rc))
			}
		}
		parts = append(parts, p)
	}
	if compared == 0 {
		return ""
	}
	s := "This run, medians against the uninstrumented build: " + strings.Join(parts, "; ") + ". "
	if inertWorse == 0 && activeWorse == 0 {
		s += fmt.Sprintf("fentry was never clearly (beyond the p10..p90 spreads) costlier than cyg, and clearly cheaper in %d of %d workloads inert and %d of %d active: ", inertBetter, compared, activeBetter, compared) +
			"an inert cyg build keeps the argument set-up, the spills and the lost tail calls the compiler arranged around its hook calls, which no placeholder removes, and an active one pays two calls per function, inlined ones included; fentry's site is one argument-less call, the function's first instruction, in real functions only."
	} else {
		s += fmt.Sprintf("fentry was clearly costlier than cyg in %d of %d workloads inert and %d of %d active (beyond the p10..p90 spreads): this run does not favour fentry; look at the machine's load before drawing a conclusion.", inertWorse, compared, activeWorse, compared)
	}
	return s
}
