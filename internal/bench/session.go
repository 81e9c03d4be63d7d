package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/probecache"
)

// RunSession is row 7: `hotpatch session` driven as a script drives it.
// (a) toggles per second: a script streams commands, alternately enabling
// and disabling the toggle target's probed() (2 probes), and reads every
// result; (b) the target's throughput while a script toggles through the
// session at fixed rates, measured as row 3 measures it.
func (h *Harness) RunSession(ctx context.Context) error {
	flipBin, _, flipList, _, err := h.toggleBuilds()
	if err != nil {
		return err
	}
	list := filepath.Join(h.B.Dir, "toggle-flip.session.probes.json")
	if err := flipList.WriteFile(list); err != nil {
		return err
	}
	hp, err := h.buildHotpatch()
	if err != nil {
		return err
	}
	t, err := h.startToggle(ctx, flipBin, h.Cfg.Executors)
	if err != nil {
		return err
	}
	defer t.Kill()
	// The session starts on the harness's CPU (it inherits the pinned
	// thread's affinity), as the harness's own toggler runs in row 3: the
	// executors keep their core.
	unpin := h.pinHarness()
	s, err := startScriptPinned(ctx, hp, h.B.Dir, h.pinHarness, "--pid", strconv.Itoa(t.Pid), "--probes", list)
	unpin()
	if err != nil {
		return err
	}
	defer s.close()
	h.logf("session pid %d, CPUs %s", s.cmd.Process.Pid, cpusAllowed(s.cmd.Process.Pid))
	r := &throughputRun{h: h, t: t, set: s.set, async: s.sendN, completed: s.completed, toggler: s.cpuNs}
	if err := checkLive(ctx, t, r.set); err != nil {
		return err
	}
	// (a) streamed toggles, and the session's CPU time per toggle.
	var rates, cpu []float64
	for i := 0; i < h.Cfg.Reps; i++ {
		c0 := s.cpuNs()
		rate, err := s.stream(h.Cfg.SessionToggles)
		if err != nil {
			return err
		}
		rates = append(rates, rate)
		cpu = append(cpu, float64(s.cpuNs()-c0)/float64(h.Cfg.SessionToggles))
	}
	// (b) throughput under toggling through the session.
	cfg := h.Cfg
	h.Cfg.Rates = cfg.SessionRates
	m, err := r.measure(ctx)
	h.Cfg.Rates = cfg.Rates
	if err != nil {
		return err
	}
	if err := s.finish(); err != nil {
		return err
	}
	if _, err := t.Quit(ctx); err != nil {
		return err
	}
	h.reportSession(rates, cpu, m)
	return nil
}

// buildHotpatch builds cmd/hotpatch into the build directory.
func (h *Harness) buildHotpatch() (string, error) {
	out := filepath.Join(h.B.Dir, "hotpatch")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/hotpatch")
	cmd.Dir = h.B.Root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/hotpatch: %v\n%s", err, b)
	}
	return out, nil
}

// script is a running `hotpatch session`: commands go to its stdin, one
// result per command comes back; a reader goroutine counts the results and
// keeps the first failure.
type script struct {
	cmd     *exec.Cmd
	in      io.WriteCloser
	w       *bufio.Writer
	cache   string
	mu      sync.Mutex
	cond    *sync.Cond
	sent    int
	got     int
	waitFor int // sync waits for this many results: read wakes it then
	failure error
	on      bool // what the next async toggle does
	done    chan struct{}
}

// startScript starts `hotpatch session` with args.
func startScript(ctx context.Context, hotpatch, dir string, args ...string) (*script, error) {
	return startScriptPinned(ctx, hotpatch, dir, nil, args...)
}

// startScriptPinned is startScript whose result reader's goroutine runs
// pin first (which pins it and returns the undo; nil: not pinned).
func startScriptPinned(ctx context.Context, hotpatch, dir string, pin func() func(), args ...string) (*script, error) {
	if pin == nil {
		pin = func() func() { return func() {} }
	}
	cache, err := os.MkdirTemp(dir, "cache-")
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, hotpatch, append([]string{"session"}, args...)...)
	cmd.Env = append(os.Environ(), probecache.EnvDir+"="+cache)
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &script{cmd: cmd, in: in, w: bufio.NewWriterSize(in, 64<<10), cache: cache, done: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	go s.read(out, pin)
	return s, nil
}

// okPrefix and okInfix are what a successful toggle's result line holds
// (the session writes it by hand: TestSessionResultJSON): such a line is
// counted without a JSON decode, every other line is decoded.
var okPrefix, okInfix = []byte(`{"line":`), []byte(`,"ok":true,"command":"`)

func (s *script) read(out io.Reader, pin func() func()) {
	defer close(s.done)
	// The reader is part of the toggler: it runs where the harness's
	// toggling runs (row 3's toggler thread), not on the executors' CPU.
	defer pin()()
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		b := sc.Bytes()
		var err error
		ok := bytes.HasPrefix(b, okPrefix) && bytes.Contains(b[len(okPrefix):], okInfix) && b[len(b)-1] == '}'
		if !ok {
			var r struct {
				OK    bool   `json:"ok"`
				Error string `json:"error"`
			}
			err = json.Unmarshal(b, &r)
			ok = err == nil && r.OK
		}
		s.mu.Lock()
		s.got++
		if s.failure == nil && !ok {
			s.failure = fmt.Errorf("session result %d: %s %v", s.got, sc.Text(), err)
		}
		if s.got >= s.waitFor {
			s.cond.Broadcast()
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	if s.failure == nil && s.got < s.sent {
		s.failure = fmt.Errorf("session ended after %d of %d results", s.got, s.sent)
	}
	s.got = s.sent // wake every waiter
	s.cond.Broadcast()
	s.mu.Unlock()
}

func line(on bool) string {
	if on {
		return "enable probed\n"
	}
	return "disable probed\n"
}

// send writes one toggle command and flushes it.
func (s *script) send(on bool) error { return s.sendN(on, 1) }

// sendN writes n alternating toggle commands, the first turning the probe
// on if on, and flushes them together: the async (burst) toggler.
func (s *script) sendN(on bool, n int) error {
	s.mu.Lock()
	s.sent += n
	s.mu.Unlock()
	for i := 0; i < n; i++ {
		if _, err := s.w.WriteString(line(on)); err != nil {
			return err
		}
		on = !on
	}
	return s.w.Flush()
}

// sync waits for every result so far and returns the first failure.
func (s *script) sync() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waitFor = s.sent
	for s.got < s.sent {
		s.cond.Wait()
	}
	return s.failure
}

// completed is how many results have come back.
func (s *script) completed() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int64(s.got)
}

// set toggles and waits for the result.
func (s *script) set(on bool) error {
	if err := s.send(on); err != nil {
		return err
	}
	return s.sync()
}

// stream writes n toggle commands as fast as the pipe takes them and
// returns toggles per second, first write to last result.
func (s *script) stream(n int) (float64, error) {
	t0 := time.Now()
	for i := 0; i < n; i++ {
		s.mu.Lock()
		s.sent++
		s.mu.Unlock()
		if _, err := s.w.WriteString(line(i%2 == 0)); err != nil {
			return 0, err
		}
	}
	if err := s.w.Flush(); err != nil {
		return 0, err
	}
	if err := s.sync(); err != nil {
		return 0, err
	}
	return float64(n) / time.Since(t0).Seconds(), nil
}

// finish ends the session (end of input) and checks it exited 0.
func (s *script) finish() error {
	if err := s.in.Close(); err != nil {
		return err
	}
	<-s.done
	if err := s.cmd.Wait(); err != nil {
		return fmt.Errorf("hotpatch session: %w", err)
	}
	return s.failure
}

func (s *script) close() {
	if s.cmd.ProcessState == nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
	}
	os.RemoveAll(s.cache)
}

// cpuNs is the session process's CPU time so far, every thread's
// (/proc/PID/task/*/schedstat), in ns.
func (s *script) cpuNs() int64 { return procCPUNs(s.cmd.Process.Pid) }

func procCPUNs(pid int) int64 {
	stats, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum int64
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // a thread that just exited
		}
		if fs := strings.Fields(string(b)); len(fs) > 0 {
			v, _ := strconv.ParseInt(fs[0], 10, 64)
			sum += v
		}
	}
	return sum
}

func (h *Harness) reportSession(rates, cpu []float64, m *throughputSamples) {
	med := func(s []float64) float64 { return Summarize(s, h.TSC).MedianNs }
	sec := Section{Title: "7. Session mode: toggles from a script over one attach",
		Text: fmt.Sprintf("`hotpatch session --pid N --probes LIST` on bench/toggle.c (row 3's target, %d executor thread(s)). "+
			"Streamed: the harness writes %d commands (`enable probed` / `disable probed`, 2 probes each) to the session's stdin as fast as the pipe takes them and reads every JSON result; toggles/s = commands / (first write to last result), %d runs. "+
			"Under toggling: row 3's method and ratios, but the toggler writes (and flushes) each %v, in one write, the command lines the rate asks for by then (a late tick made up in the next, %d ticks' worth at most) and sleeps in between instead of spinning; the session and the harness's result reader run on the harness's CPU (the executors keep theirs), and the achieved rate counts the results that came back in the window, not the lines sent; %d rounds, each rate in %d cycles of three %v windows (enabled, disabled, toggled; D91).",
			h.Cfg.Executors, h.Cfg.SessionToggles, len(rates), burstTick, maxCatchUp, h.Cfg.Reps, cycles, h.Cfg.Window/cycles),
		Head: []string{"measure", "value"}}
	rs := Summarize(rates, h.TSC)
	h.Rep.Set("session.toggles_per_s", rs.MedianNs)
	sec.Rows = append(sec.Rows, []string{"streamed toggles/s (median, p10-p90)", fmt.Sprintf("%.3g (%.3g-%.3g)", rs.MedianNs, rs.P10Ns, rs.P90Ns)})
	cs := Summarize(cpu, h.TSC)
	h.Rep.Set("session_detail.cpu_ns_per_toggle", cs.MedianNs)
	sec.Rows = append(sec.Rows, []string{"session CPU time per streamed toggle (every thread; at 1e5 toggles/s, the share of one CPU)",
		fmt.Sprintf("%s (%s-%s); %.0f%%", fmtNs(cs.MedianNs), fmtNs(cs.P10Ns), fmtNs(cs.P90Ns), cs.MedianNs*1e5/1e9*100)})
	for _, r := range h.Cfg.SessionRates {
		cl := m.cell(r)
		name := rateName(r)
		if len(cl.wallRatio) == 0 {
			h.Rep.Skip("session_throughput_ratio."+name, fmt.Sprintf("in all %d rounds the executors were on their CPU less than half the window", cl.starved))
			sec.Rows = append(sec.Rows, []string{"throughput ratio at " + name + "/s", "not measured: executors starved in every round"})
			continue
		}
		ws := Summarize(cl.wallRatio, h.TSC)
		cs := Summarize(cl.ratio, h.TSC)
		h.Rep.Set("session_throughput_ratio."+name, ws.MedianNs)
		h.Rep.Set("session_detail.achieved_toggles_per_s."+name, med(cl.achieved))
		h.Rep.Set("session_detail.cpu_ratio."+name, cs.MedianNs)
		dropped := ""
		if cl.starved > 0 {
			dropped = fmt.Sprintf("; %d of %d rounds set aside: executors on CPU < 50%% of the window", cl.starved, cl.starved+len(cl.wallRatio))
		}
		sec.Rows = append(sec.Rows, []string{fmt.Sprintf("target throughput at %s/s, x untoggled (wall; achieved %.3g toggles/s; executors on CPU %.0f%%, session %.0f%%%s)", name, med(cl.achieved), 100*med(cl.share), 100*med(cl.toggler), dropped),
			fmt.Sprintf("%.3f (%.3f-%.3f)", ws.MedianNs, ws.P10Ns, ws.P90Ns)},
			[]string{fmt.Sprintf("the same per executor CPU-second (what toggling costs the executors while they run; row 3's `ratio (CPU)`) at %s/s", name),
				fmt.Sprintf("%.3f (%.3f-%.3f)", cs.MedianNs, cs.P10Ns, cs.P90Ns)})
	}
	sec.Foot = "Targets (issue 13): >= 100,000 toggles/s from a script; target throughput at 100,000 toggles/s >= 0.95 of untoggled."
	h.Rep.Add(sec)
}

// cpusAllowed is pid's Cpus_allowed_list, for the log.
func cpusAllowed(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}
