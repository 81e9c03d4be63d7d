package bench

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"time"
)

// cliPeer is one peer's way of putting one probe on the row 6 function of
// the same running program and taking it off again, as whole commands,
// exec to exit.
type cliPeer struct {
	key, name, note string
	tool            string
	run             func(ctx context.Context) (float64, error)
}

// peers are perf probe, bpftrace and gdb on row 6's target and function.
func (r *cliRun) peers() []cliPeer {
	bin, pid := r.bin, strconv.Itoa(r.t.Pid)
	group := fmt.Sprintf("epcli%d", time.Now().Unix()%100000)
	return []cliPeer{
		{key: "peer_perf", name: "`perf probe -a` + `perf probe -d` (two commands)", tool: "perf",
			note: "creates the uprobe event and deletes it; enabling it takes a third command (perf record or tracefs)",
			run: func(ctx context.Context) (float64, error) {
				a, _, err := timeCmd(ctx, "perf", "probe", "-q", "-x", bin, "-a", group+":ev="+r.fn)
				if err != nil {
					return 0, err
				}
				d, _, err := timeCmd(ctx, "perf", "probe", "-q", "-d", group+":*")
				return a + d, err
			}},
		{key: "peer_bpftrace", name: "`bpftrace -e 'uprobe:...'` (attach, exit)", tool: "bpftrace",
			note: "attaches the uprobe to the binary (every process running it) and exits at once",
			run: func(ctx context.Context) (float64, error) {
				d, _, err := timeCmd(ctx, "bpftrace", "-e", "uprobe:"+bin+":"+r.fn+" { @n = count(); } BEGIN { exit(); }")
				return d, err
			}},
		{key: "peer_gdb", name: "`gdb -p PID -ex 'break F' -ex detach`", tool: "gdb",
			note: "attaches (stopping the process), reads its symbols, inserts the breakpoint, removes it, detaches",
			run: func(ctx context.Context) (float64, error) {
				d, _, err := timeCmd(ctx, "gdb", "-nx", "-batch", "-p", pid, "-ex", "set breakpoint always-inserted on", "-ex", "break "+r.fn, "-ex", "detach")
				return d, err
			}},
	}
}

// measurePeers runs each installed peer Reps times (after one untimed run);
// a peer that is missing or fails is skipped with the reason.
func (r *cliRun) measurePeers(ctx context.Context) (map[string][]float64, map[string]string) {
	out, skipped := map[string][]float64{}, map[string]string{}
	for _, p := range r.peers() {
		if _, err := exec.LookPath(p.tool); err != nil {
			skipped[p.key] = p.tool + " is not installed (`benchreport -setup` installs it)"
			continue
		}
		for i := -1; i < r.h.Cfg.Reps; i++ {
			d, err := p.run(ctx)
			if err != nil {
				skipped[p.key] = err.Error()
				delete(out, p.key)
				break
			}
			if i >= 0 {
				out[p.key] = append(out[p.key], d)
			}
		}
	}
	return out, skipped
}

// reportPeers adds the peers' rows to row 6: exec to exit, as a ratio to
// `hotpatch --help` and to one hotpatch toggle with its list.
func (h *Harness) reportPeers(r *cliRun, sec *Section, m *cliSamples, peers map[string][]float64, skipped map[string]string) {
	help, toggle := Summarize(m.help, h.TSC), Summarize(m.list, h.TSC)
	for _, p := range r.peers() {
		if why, ok := skipped[p.key]; ok {
			h.Rep.Skip("cli."+p.key, why)
			sec.Rows = append(sec.Rows, []string{p.name, "not run: " + why, "", ""})
			continue
		}
		s := Summarize(peers[p.key], h.TSC)
		h.Rep.SetStat("cli."+p.key, s)
		ratio := ""
		if help.MedianNs > 0 && toggle.MedianNs > 0 {
			ratio = fmt.Sprintf("%.2fx (%.2fx our toggle)", s.MedianNs/help.MedianNs, s.MedianNs/toggle.MedianNs)
			h.Rep.Set("cli_ratio."+p.key+"_vs_toggle", s.MedianNs/toggle.MedianNs)
		}
		sec.Rows = append(sec.Rows, []string{p.name + ": " + p.note, Cell(s), ratio, ""})
	}
}
