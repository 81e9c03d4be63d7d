package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/phases"
	"github.com/edgeprobe/edgeprobe/internal/probecache"
)

// ownPhase is one phase of a toggle as the command's own phase timer
// (internal/phases, EDGEPROBE_PHASES=1) reports it, over the runs.
type ownPhase struct {
	name            string
	wall, cpu, vcsw []float64 // ns, ns, count
}

// ownPhases runs the cached toggle with the list Reps*3 times (enable and
// disable alternating) with the command's phase timer on, and collects
// each phase's wall and CPU time and voluntary context switches; "exec to
// main" is from just before the exec to the command's first mark (the CPU
// column: all the process used by then: the Go runtime's start and every
// package's initialisation), "exit" from its last mark to the end of the
// wait for it.
func (r *cliRun) ownPhases(ctx context.Context) ([]*ownPhase, error) {
	pid := strconv.Itoa(r.t.Pid)
	byName := map[string]*ownPhase{}
	var order []*ownPhase
	get := func(name string) *ownPhase {
		p := byName[name]
		if p == nil {
			p = &ownPhase{name: name}
			byName[name] = p
			order = append(order, p)
		}
		return p
	}
	get("exec to main")
	for i := -1; i < r.h.Cfg.Reps*3; i++ { // i = -1: a first call, not counted
		verb := "--enable"
		if i%2 != 0 {
			verb = "--disable"
		}
		cmd := exec.CommandContext(ctx, r.hotpatch, "--pid", pid, "--probes", r.list, verb, r.fn)
		cmd.Env = append(os.Environ(), probecache.EnvDir+"="+r.cache, phases.Env+"=1")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		t0 := monoNow()
		err := cmd.Run()
		t1 := monoNow()
		if err != nil {
			return nil, fmt.Errorf("hotpatch %s: %v: %s", verb, err, firstLine(stderr.String()))
		}
		lines, err := phases.Parse(stderr.Bytes())
		if err != nil || len(lines) < 3 {
			return nil, fmt.Errorf("hotpatch printed no phase table (%s=1): %v: %q", phases.Env, err, firstLine(stderr.String()))
		}
		if i < 0 {
			continue
		}
		first, last := lines[0], lines[len(lines)-1]
		p := get("exec to main")
		p.wall = append(p.wall, float64(first.Mono-t0))
		p.cpu = append(p.cpu, float64(first.CPU))
		p.vcsw = append(p.vcsw, float64(first.Vcsw))
		for _, l := range lines[1 : len(lines)-1] {
			p := get(l.Name)
			p.wall = append(p.wall, float64(l.Wall))
			p.cpu = append(p.cpu, float64(l.CPU))
			p.vcsw = append(p.vcsw, float64(l.Vcsw))
		}
		p = get("exit")
		p.wall = append(p.wall, float64(t1-last.Mono))
	}
	return order, nil
}

func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func (h *Harness) reportOwnPhases(own []*ownPhase) {
	n := 0
	if len(own) > 0 {
		n = len(own[0].wall)
	}
	sec := Section{Title: "6c. One toggle by its own phase timer",
		Text: fmt.Sprintf("The cached toggle with `--probes` (enable and disable alternating) run as a script runs it, %d times, with hotpatch's phase timer on (`EDGEPROBE_PHASES=1`, internal/phases): each phase's wall time, CPU time (user+sys of the whole process) and voluntary context switches, as the command measured them itself. "+
			"exec to main: from just before the exec to the command's first mark; its CPU is all the process used by then (the Go runtime's start and every package's initialisation). "+
			"cobra: the command line parsed; signals: SIGINT and the others caught (each a round trip to Go's signal-mask thread); lock: the run's own tracer thread started (ptrace.Run), the leader seized; runtime: the hooks checked (inject.Inspect, under the lock); targets: the list's cache entry; prepare: the selection and its check against the scan; before, write, after: the sites read, flipped, read back; detach: the release waited for; end: the rest of the command; exit: from the last mark to the end of the wait for the process.", n),
		Head: []string{"phase", "wall", "CPU", "voluntary context switches"}}
	for _, p := range own {
		key := strings.ReplaceAll(p.name, " ", "_")
		w := Summarize(p.wall, h.TSC)
		h.Rep.SetStat("cli_own."+key, w)
		cpuCell, vcswCell := "", ""
		if len(p.cpu) > 0 {
			c := Summarize(p.cpu, h.TSC)
			h.Rep.SetStat("cli_own_cpu."+key, c)
			cpuCell = fmtNs(c.MedianNs)
			vcswCell = fmt.Sprintf("%.0f", Summarize(p.vcsw, h.TSC).MedianNs)
		}
		sec.Rows = append(sec.Rows, []string{p.name, Cell(w), cpuCell, vcswCell})
	}
	sec.Foot = "Wall times are medians of each phase on its own; they need not add up to the row above's median."
	h.Rep.Add(sec)
}
