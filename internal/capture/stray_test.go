package capture

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestTraceStrayEvent: an event a hook decided under one capture's control
// word and wrote after the next capture had started is not in the next
// capture, and is counted (D79). park.c's thread A is held inside its hook
// of a work() call during a `--tid A` capture, after the hook decided to
// write that call's enter event (a runtime built with -DEP_TEST_PARK calls
// the program there); that capture ends; a `--tid B` capture starts; A is
// released and writes the event into its ring. The second trace must hold
// B's calls and none of A's, with stale_events 1; the first, A's calls
// only. No timing is involved: the test holds A at that point and lets it
// go once the second capture's events are on. Before D79 the second trace
// held A's call (the Matcher closed it as still running): every run. With
// --rate on the first capture the event is decided by A's quota slot
// (D55): A holds its slot in flight, so that capture waits its second for
// it and counts it (rate_in_flight 1); the second drops the event all the
// same.
func TestTraceStrayEvent(t *testing.T) {
	for _, spec := range []testutil.Spec{
		{Sources: []string{"park.c"}, LDFlags: []string{"-rdynamic"}},
		{Sources: []string{"park.c"}, LDFlags: []string{"-rdynamic"}, NoInstr: true, Profile: testutil.ProfileFentry},
	} {
		t.Run(spec.String(), func(t *testing.T) { strayEvent(t, spec, false) })
		t.Run(spec.String()+"-rate", func(t *testing.T) { strayEvent(t, spec, true) })
	}
}

func strayEvent(t *testing.T, spec testutil.Spec, rate bool) {
	testutil.RequirePtrace(t)
	lib := testutil.RuntimeWith(t, "gcc", "-DEP_TEST_PARK")
	fx := testutil.Build(t, spec)
	if r := testutil.Run(t, "coldpatch", fx.Path); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	dir := t.TempDir()
	arm, release := filepath.Join(dir, "arm"), filepath.Join(dir, "release")
	p := testutil.Start(t, []string{"LD_PRELOAD=" + lib}, fx.Path, arm, release)
	a, b := namedThread(t, p.Pid, "park-a"), namedThread(t, p.Pid, "park-b")
	pid := fmt.Sprint(p.Pid)
	run(t, "--pid", pid, "--enable", "work") // on across both captures: neither turns a probe on
	region, err := shm.OpenPID(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()

	out1, out2 := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")
	args1 := []string{"trace", "--pid", pid, "--tid", strconv.Itoa(a), "--duration", "10m", "-o", out1, "--json"}
	if rate {
		args1 = append(args1, "--rate", "1000000000") // a quota A's calls never use up
	}
	c1 := runCapture(t, args1...)
	waitFor(t, "capture 1 to start", func() bool { return region.Control()&shm.CtlTrace != 0 })
	// A's calls in capture 1 before it parks: its ring's head moves on
	waitFor(t, "A's thread slot", func() bool { return hasSlot(region, a) }) // a loaded machine may not have run A's first hook yet
	h0 := ringHead(t, region, a)
	waitFor(t, "A's events in capture 1", func() bool { return ringHead(t, region, a) >= h0+8 })
	touch(t, arm)
	if l := p.Line(); l != "parked" {
		t.Fatalf("want A parked inside its hook, got %q", l)
	}
	sum1 := c1.interrupt(t)
	if want := map[bool]int{false: 0, true: 1}[rate]; sum1.InFlight != want {
		t.Errorf("capture 1: rate_in_flight %d; want %d (A holds its quota slot inside the hook)", sum1.InFlight, want)
	}

	c2 := runCapture(t, "trace", "--pid", pid, "--tid", strconv.Itoa(b), "--duration", "10m", "-o", out2, "--json")
	waitFor(t, "capture 2 to start", func() bool { return region.Control()&shm.CtlTrace != 0 })
	waitFor(t, "B's thread slot", func() bool { return hasSlot(region, b) })
	hb := ringHead(t, region, b)
	touch(t, release)
	if l := p.Line(); l != "released" {
		t.Fatalf("want A's parked call returned, got %q", l)
	}
	// B's calls in capture 2 (a loaded machine may not have run it yet)
	waitFor(t, "B's events in capture 2", func() bool { return ringHead(t, region, b) >= hb+8 })
	sum2 := c2.interrupt(t)

	for i, c := range []struct {
		out  string
		sum  traceSummary
		tid  int
		want uint64
	}{{out1, sum1, a, 0}, {out2, sum2, b, 1}} {
		per := map[int]int{}
		for _, s := range chromeCalls(t, c.out) {
			per[s.Tid]++
		}
		if per[c.tid] == 0 || len(per) != 1 {
			t.Errorf("capture %d with --tid %d: calls by thread %v; want only thread %d's (A %d, B %d)", i+1, c.tid, per, c.tid, a, b)
		}
		if c.sum.Stale != c.want {
			t.Errorf("capture %d: stale_events %d; want %d", i+1, c.sum.Stale, c.want)
		}
	}
	run(t, "--pid", pid, "--disable", "work")
	allOff(t, p)
	if o, _ := p.Finish(); !strings.HasPrefix(o, "done ") {
		t.Fatalf("program output %q", o)
	}
}

// namedThread returns the id of pid's thread called name (comm).
func namedThread(t *testing.T, pid int, name string) int {
	t.Helper()
	for _, tid := range workerTids(t, pid) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/comm", pid, tid))
		if err == nil && strings.TrimSpace(string(b)) == name {
			return tid
		}
	}
	t.Fatalf("pid %d has no thread named %s", pid, name)
	return 0
}

// ringHead is the events thread tid has written into its ring so far.
// hasSlot reports whether thread tid owns a slot of the region yet (its
// first hook call makes it).
func hasSlot(r *shm.Region, tid int) bool {
	for _, th := range r.Threads() {
		if th.Owned && int(th.Tid) == tid {
			return true
		}
	}
	return false
}

func ringHead(t *testing.T, r *shm.Region, tid int) uint64 {
	t.Helper()
	for _, th := range r.Threads() {
		if th.Owned && int(th.Tid) == tid {
			return th.RingHead
		}
	}
	t.Fatalf("thread %d has no slot", tid)
	return 0
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// capture is a hotpatch capture running in the background.
type capture struct {
	cmd      *exec.Cmd
	out, err bytes.Buffer
}

func runCapture(t *testing.T, args ...string) *capture {
	t.Helper()
	c := &capture{cmd: exec.Command(testutil.Command(t, "hotpatch"), args...)}
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.err
	if err := testutil.StartBound(c.cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			c.cmd.Process.Kill()
			c.cmd.Wait()
		}
	})
	return c
}

type traceSummary struct {
	Calls    uint64 `json:"calls"`
	Stale    uint64 `json:"stale_events"`
	InFlight int    `json:"rate_in_flight"`
}

// interrupt ends the capture as ^C does (it writes what it recorded and
// puts everything back) and returns its --json summary.
func (c *capture) interrupt(t *testing.T) traceSummary {
	t.Helper()
	var s traceSummary
	c.interruptInto(t, &s)
	return s
}

// interruptInto is interrupt decoding the summary into sum.
func (c *capture) interruptInto(t *testing.T, sum any) {
	t.Helper()
	if err := c.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("%v: %v: %s", c.cmd.Args, err, c.err.String())
	}
	if err := json.Unmarshal(c.out.Bytes(), sum); err != nil {
		t.Fatalf("summary %q: %v (stderr %q)", c.out.String(), err, c.err.String())
	}
}
