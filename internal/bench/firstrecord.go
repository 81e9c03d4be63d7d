package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/shm"
)

// RunFirstRecord is row 5b: from a process running, started without any
// tool, to the first call of one function counted, per peer, on the same
// target (micro.c, -finstrument-functions, looping over empty()).
// edgeprobe: `hotpatch --enable empty` (which loads the runtime into the
// process, docs/injection.md) until the runtime's region counts an entry;
// bpftrace: `bpftrace -p PID -e 'uprobe:BIN:empty { printf(...); exit() }'`
// until its line arrives; perf: `perf probe -x BIN -a` then `perf stat -I 10`
// on the process until an interval counts a hit. Each rep uses a fresh
// process (the runtime stays loaded in the one it was loaded into).
func (h *Harness) RunFirstRecord(ctx context.Context) error {
	sec := Section{Title: "5b. Attach to first record",
		Text: "A running process started without any tool, to the first call of one function counted: each rep starts a fresh micro target (gcc -finstrument-functions, looping over empty()) and times one peer from its command's start until a record of a call is seen. edgeprobe: `hotpatch --enable empty` loads the runtime into the process and routes its hooks (docs/injection.md), then the runtime's region is polled until empty() has an entry. bpftrace: a uprobe program that prints a line on its first hit. perf: `perf probe -x BIN -a` then `perf stat -I 10 -p PID` until an interval counts a hit. Whole commands, start-up included.",
		Head: []string{"peer", "attach to first record", "note"}}
	defer func() { h.Rep.Add(sec) }()
	row := func(key, name string, s Summary, note string) {
		h.Rep.SetStat("first."+key, s)
		sec.Rows = append(sec.Rows, []string{name, Cell(s), note})
	}
	skip := func(key, name, reason string) {
		h.Rep.Skip("first."+key, reason)
		sec.Rows = append(sec.Rows, []string{name, "not run", reason})
	}
	m, err := h.buildMicro()
	if err != nil {
		return err
	}
	hp := filepath.Join(h.B.Dir, "hotpatch")
	build := exec.Command("go", "build", "-o", hp, "./cmd/hotpatch")
	build.Dir = h.B.Root
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/hotpatch: %v\n%s", err, out)
	}
	peers := []struct {
		key, name, note string
		tool            string
		fn              func(ctx context.Context, t *Target) (time.Duration, error)
	}{
		{"edgeprobe", "edgeprobe (hotpatch --enable, runtime loaded)", "load + route + flip, then the first entry in the region", "", func(ctx context.Context, t *Target) (time.Duration, error) {
			return h.firstEdgeprobe(ctx, hp, t)
		}},
		{"bpftrace", "uprobe (bpftrace -p)", "first hit printed", "bpftrace", func(ctx context.Context, t *Target) (time.Duration, error) {
			return firstBpftrace(ctx, m.instr, t)
		}},
		{"perf", "uprobe (perf probe + perf stat -I 10)", "first 10 ms interval with a hit", "perf", func(ctx context.Context, t *Target) (time.Duration, error) {
			return firstPerf(ctx, m.instr, t)
		}},
	}
	for _, p := range peers {
		if p.tool != "" {
			if _, err := exec.LookPath(p.tool); err != nil {
				skip(p.key, p.name, p.tool+" is not installed")
				continue
			}
		}
		var ns []float64
		var perr error
		for i := 0; i < h.Cfg.AttachReps && perr == nil; i++ {
			t, err := Start(ctx, nil, m.instr, "1000000000000", "wait")
			if err != nil {
				return err
			}
			if err := t.Send("go"); err != nil {
				t.Kill()
				return err
			}
			d, err := p.fn(ctx, t)
			t.Kill()
			if err != nil {
				perr = err
				break
			}
			ns = append(ns, float64(d.Nanoseconds()))
		}
		if perr != nil {
			skip(p.key, p.name, firstLine(perr.Error()))
			continue
		}
		row(p.key, p.name, Summarize(ns, h.TSC), p.note)
	}
	return nil
}

func (h *Harness) firstEdgeprobe(ctx context.Context, hp string, t *Target) (time.Duration, error) {
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, hp, "--pid", strconv.Itoa(t.Pid), "--enable", "empty", "--runtime", h.Runtime)
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("hotpatch: %v: %s", err, tail(strings.TrimSpace(string(out)), 300))
	}
	r, err := shm.OpenPID(t.Pid)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	deadline := t0.Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, f := range r.Functions() {
			if f.Entries > 0 {
				return time.Since(t0), nil
			}
		}
	}
	return 0, fmt.Errorf("no entry recorded in 30s")
}

func firstBpftrace(ctx context.Context, bin string, t *Target) (time.Duration, error) {
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, "bpftrace", "-p", strconv.Itoa(t.Pid), "-e", "uprobe:"+bin+":empty { printf(\"hit\\n\"); exit(); }")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "hit" {
			return time.Since(t0), nil
		}
	}
	return 0, fmt.Errorf("bpftrace ended without a hit: %s", tail(strings.TrimSpace(stderr.String()), 300))
}

func firstPerf(ctx context.Context, bin string, t *Target) (time.Duration, error) {
	group := fmt.Sprintf("epfirst%d", os.Getpid())
	t0 := time.Now()
	if _, _, err := timeCmd(ctx, "perf", "probe", "-q", "-x", bin, "-a", group+":ev=empty"); err != nil {
		return 0, err
	}
	defer func() { _, _, _ = timeCmd(context.Background(), "perf", "probe", "-q", "-d", group+":*") }()
	cmd := exec.CommandContext(ctx, "perf", "stat", "-I", "10", "-x", ",", "-e", group+":ev", "-p", strconv.Itoa(t.Pid))
	errp, err := cmd.StderrPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(errp)
	var last string
	for sc.Scan() {
		last = sc.Text()
		f := strings.Split(last, ",")
		if len(f) > 1 {
			if n, err := strconv.ParseFloat(strings.TrimSpace(f[1]), 64); err == nil && n > 0 {
				return time.Since(t0), nil
			}
		}
	}
	return 0, fmt.Errorf("perf stat ended without a hit: %s", last)
}
