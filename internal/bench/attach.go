package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// RunAttach is row 5: attaching/enabling one probe, per peer.
func (h *Harness) RunAttach(ctx context.Context) error {
	sec := Section{Title: "5. Attach / enable time per probe",
		Text: "From nothing to one enabled probe in a running process, per probe. edgeprobe: open /proc/PID/mem, read /proc/PID/maps for the load bias, flip one site (toggle target). uprobe (tracefs): write the probe to uprobe_events and enable it while a process maps the binary. `perf probe -a` and bpftrace are whole commands (process start-up, symbol lookup; `perf probe` only creates the event). XRay: `__xray_patch()` of every function of the generated program, divided by the functions. gdb: `gdb -p`, then K `break` commands with `breakpoint always-inserted on` (each inserted into the process at once), timed by gdb's python, divided by K; the whole `gdb -p ... detach` command is listed beside.",
		Head: []string{"peer", "per probe", "note"}}
	defer func() { h.Rep.Add(sec) }()
	row := func(key, name string, s Summary, note string) {
		h.Rep.SetStat("peers."+key, s)
		sec.Rows = append(sec.Rows, []string{name, Cell(s), note})
	}
	skip := func(key, name, reason string) {
		h.Rep.Skip("peers."+key, reason)
		sec.Rows = append(sec.Rows, []string{name, "not run", reason})
	}
	reps := h.Cfg.AttachReps

	// edgeprobe
	flipBin, _, flipList, _, err := h.toggleBuilds()
	if err != nil {
		return err
	}
	t, err := h.startToggle(ctx, flipBin, h.Cfg.Executors)
	if err != nil {
		return err
	}
	var ep []float64
	for i := 0; i < reps+1; i++ {
		t0 := time.Now()
		mem, err := ptrace.OpenMem(t.Pid)
		if err != nil {
			t.Kill()
			return err
		}
		sites, err := Sites(t.Pid, flipList, "probed", "entry")
		if err == nil {
			_, err = xmod.Flip(ctx, mem, changes(sites, true), xmod.FlipOptions{})
		}
		d := time.Since(t0)
		if err == nil {
			_, err = xmod.Flip(ctx, mem, changes(sites, false), xmod.FlipOptions{})
		}
		mem.Close()
		if err != nil {
			t.Kill()
			return err
		}
		if i > 0 {
			ep = append(ep, float64(d.Nanoseconds()))
		}
	}
	if _, err := t.Quit(ctx); err != nil {
		return err
	}
	row("edgeprobe_attach", "edgeprobe (open + maps + flip)", Summarize(ep, h.TSC), "toggling an already-open process: see row 1")

	// uprobes
	m, err := h.buildMicro()
	if err != nil {
		return err
	}
	up := newUprobes(h)
	if reason := up.available(); reason != "" {
		skip("uprobe_attach", "uprobe (tracefs)", reason)
	} else if err := h.uprobeAttach(ctx, up, m.uninstr, row); err != nil {
		skip("uprobe_attach", "uprobe (tracefs)", err.Error())
	}
	h.perfAttach(ctx, m.uninstr, row, skip)
	h.bpftraceAttach(ctx, m.uninstr, row, skip)

	// XRay
	if xb, err := h.buildMany(h.Cfg.BatchFuncs, true); err != nil {
		skip("xray_attach", "LLVM XRay __xray_patch", "cannot build the XRay program: "+firstLine(err.Error()))
	} else if err := h.xrayAttach(ctx, xb, row); err != nil {
		skip("xray_attach", "LLVM XRay __xray_patch", err.Error())
	}

	// gdb
	if _, err := exec.LookPath("gdb"); err != nil {
		skip("gdb_attach", "gdb breakpoint", "gdb is not installed (apt-get install gdb)")
	} else if err := h.gdbAttach(ctx, row); err != nil {
		skip("gdb_attach", "gdb breakpoint", err.Error())
	}
	return nil
}

func (h *Harness) uprobeAttach(ctx context.Context, up *uprobes, bin string, row func(string, string, Summary, string)) error {
	_, _, off, err := symbol(bin, "empty")
	if err != nil {
		return err
	}
	t, err := Start(ctx, nil, bin, "1", "wait") // maps the binary, waits
	if err != nil {
		return err
	}
	defer t.Kill()
	var ns []float64
	for i := 0; i < h.Cfg.AttachReps+1; i++ {
		t0 := time.Now()
		err := up.add("p", "attach", bin, off, true)
		d := time.Since(t0)
		up.del("attach")
		if err != nil {
			return err
		}
		if i > 0 {
			ns = append(ns, float64(d.Nanoseconds()))
		}
	}
	row("uprobe_attach", "uprobe (tracefs create + enable)", Summarize(ns, h.TSC), "one process maps the binary")
	return nil
}

func timeCmd(ctx context.Context, name string, args ...string) (float64, string, error) {
	t0 := time.Now()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	d := time.Since(t0)
	if err != nil {
		return 0, string(out), fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, tail(strings.TrimSpace(string(out)), 300))
	}
	return float64(d.Nanoseconds()), string(out), nil
}

func (h *Harness) perfAttach(ctx context.Context, bin string, row func(string, string, Summary, string), skip func(string, string, string)) {
	const key, name = "uprobe_attach_perf", "uprobe (perf probe -a, whole command)"
	if _, err := exec.LookPath("perf"); err != nil {
		skip(key, name, "perf is not installed (apt-get install linux-perf)")
		return
	}
	group := fmt.Sprintf("epperf%d", h.Rep.Meta.NumCPU*0+int(time.Now().Unix()%100000))
	var ns []float64
	for i := 0; i < h.Cfg.AttachReps; i++ {
		d, _, err := timeCmd(ctx, "perf", "probe", "-q", "-x", bin, "-a", group+":ev=empty")
		_, _, _ = timeCmd(ctx, "perf", "probe", "-q", "-d", group+":*")
		if err != nil {
			skip(key, name, err.Error())
			return
		}
		ns = append(ns, d)
	}
	row(key, name, Summarize(ns, h.TSC), "creates the event only; includes perf's start-up")
}

func (h *Harness) bpftraceAttach(ctx context.Context, bin string, row func(string, string, Summary, string), skip func(string, string, string)) {
	const key, name = "uprobe_attach_bpftrace", "uprobe (bpftrace, whole command)"
	if _, err := exec.LookPath("bpftrace"); err != nil {
		skip(key, name, "bpftrace is not installed (apt-get install bpftrace; `benchreport -setup` does it)")
		return
	}
	var ns []float64
	for i := 0; i < h.Cfg.AttachReps; i++ {
		with, _, err := timeCmd(ctx, "bpftrace", "-e", "uprobe:"+bin+":empty { @n = count(); } BEGIN { exit(); }")
		if err != nil {
			skip(key, name, err.Error())
			return
		}
		without, _, err := timeCmd(ctx, "bpftrace", "-e", "BEGIN { exit(); }")
		if err != nil {
			skip(key, name, err.Error())
			return
		}
		ns = append(ns, with-without)
	}
	row(key, name, Summarize(ns, h.TSC), "bpftrace with the uprobe minus bpftrace without it")
}

func (h *Harness) xrayAttach(ctx context.Context, bin string, row func(string, string, Summary, string)) error {
	t, err := Start(ctx, nil, bin)
	if err != nil {
		return err
	}
	defer t.Kill()
	var ns, un []float64
	funcs := 0.0
	for i := 0; i < h.Cfg.AttachReps+1; i++ {
		l, err := t.Ask(ctx, "xray")
		if err != nil {
			return err
		}
		kv := parseKV(l)
		if !strings.Contains(l, "status=1,1") || kv["funcs"] < float64(h.Cfg.BatchFuncs) {
			return fmt.Errorf("xray patch: %q (want status 1,1 and >= %d functions)", l, h.Cfg.BatchFuncs)
		}
		funcs = kv["funcs"]
		if i > 0 {
			ns = append(ns, kv["patch_ns"]/funcs)
			un = append(un, kv["unpatch_ns"]/funcs)
		}
	}
	if _, err := t.Quit(ctx); err != nil {
		return err
	}
	u := Summarize(un, h.TSC)
	h.Rep.Stats["peers.xray_detach"] = u
	row("xray_attach", "LLVM XRay __xray_patch", Summarize(ns, h.TSC), fmt.Sprintf("%.0f functions patched per call; __xray_unpatch per function: %s", funcs, Cell(u)))
	return nil
}

func (h *Harness) gdbAttach(ctx context.Context, row func(string, string, Summary, string)) error {
	bin, err := h.buildMany(h.Cfg.BatchFuncs, false)
	if err != nil {
		return err
	}
	t, err := Start(ctx, nil, bin)
	if err != nil {
		return err
	}
	defer t.Kill()
	k := h.Cfg.GdbBreaks
	// gdb times its own breakpoint insertions (its python), so gdb's
	// start-up and symbol loading stay out of the per-breakpoint figure.
	py := fmt.Sprintf(`python
import time
t0 = time.perf_counter()
for i in range(%d):
    gdb.execute("break f%%d" %% i, to_string=True)
t1 = time.perf_counter()
print("gdbtime breaks=%%d ns=%%d" %% (len(gdb.breakpoints()), int((t1 - t0) * 1e9)))
end
`, k)
	sf := tempFile(h.B.Dir, "gdb-*.py.cmd")
	if err := os.WriteFile(sf, []byte(py), 0o644); err != nil {
		return err
	}
	defer os.Remove(sf)
	var per, base []float64
	reps := max(3, h.Cfg.AttachReps/2)
	for i := 0; i < reps; i++ {
		d, out, err := timeCmd(ctx, "gdb", "-nx", "-batch", "-p", strconv.Itoa(t.Pid), "-ex", "set breakpoint always-inserted on", "-x", sf, "-ex", "detach")
		if err != nil {
			return err
		}
		var kv map[string]float64
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "gdbtime ") {
				kv = parseKV(l)
			}
		}
		if kv == nil || int(kv["breaks"]) != k {
			return fmt.Errorf("gdb did not set %d breakpoints:\n%s", k, tail(out, 1000))
		}
		per, base = append(per, kv["ns"]/float64(k)), append(base, d)
	}
	c, err := t.Quit(ctx)
	if err != nil {
		return fmt.Errorf("target after gdb detached: %w", err)
	}
	_ = c
	b := Summarize(base, h.TSC)
	h.Rep.Stats["peers.gdb_attach_process"] = b
	row("gdb_attach", "gdb breakpoint (gdb -p, inserted)", Summarize(per, h.TSC), fmt.Sprintf("%d breakpoints; the whole gdb -p command: %s", k, Cell(b)))
	return nil
}
