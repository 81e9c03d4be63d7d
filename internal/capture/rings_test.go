package capture

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestTraceRingEvents: a burst the default rings (512 events) cannot hold
// loses events, counted per thread exactly (kept + dropped = the thread's
// 2 x calls) and reported with the flag that prevents it; the same burst
// traced with --ring-events large enough for it loses nothing, whatever the
// timing of the drains. The rings go back to the default size afterwards.
func TestTraceRingEvents(t *testing.T) {
	testutil.RequirePtrace(t)
	const threads, calls = 2, 30000 // 60,001 events per thread fit 65,536-event rings
	lib := testutil.Runtime(t, "gcc")
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"burst.c"}, LDFlags: []string{"-pthread"}})
	if r := testutil.Run(t, "coldpatch", fx.Path); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	type summary struct {
		Events    uint64 `json:"events"`
		Dropped   uint64 `json:"dropped_events"`
		Ring      uint32 `json:"ring_events"`
		Capacity  uint32 `json:"ring_capacity"`
		Suggested uint32 `json:"suggested_ring_events"`
		Threads   []struct {
			Tid     int32  `json:"tid"`
			Events  uint64 `json:"events"`
			Dropped uint64 `json:"dropped"`
		} `json:"threads"`
	}
	burst := func(t *testing.T, extra ...string) (summary, string) { // the summary and the text trace
		dir := t.TempDir()
		goFile, doneFile := filepath.Join(dir, "go"), filepath.Join(dir, "done")
		p := testutil.Start(t, []string{"LD_PRELOAD=" + lib}, fx.Path, goFile, doneFile, fmt.Sprint(threads), fmt.Sprint(calls))
		args := append([]string{"trace", "--pid", fmt.Sprint(p.Pid), "--enable", "leaf", "--duration", "5m", "--format", "text", "-o", filepath.Join(dir, "t.txt"), "--json"}, extra...)
		cmd := exec.Command(testutil.Command(t, "hotpatch"), args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := testutil.StartBound(cmd); err != nil {
			t.Fatal(err)
		}
		defer cmd.Process.Kill()
		// The cue once the rings are on (a state to wait for, polled).
		region, err := shm.OpenPID(p.Pid)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the trace to start", func() bool { return region.Control()&shm.CtlTrace != 0 })
		region.Close()
		os.WriteFile(goFile, nil, 0o644)
		waitFor(t, "the burst to end", func() bool { _, err := os.Stat(doneFile); return err == nil })
		cmd.Process.Signal(syscall.SIGINT)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("trace: %v: %s", err, stderr.String())
		}
		region, err = shm.OpenPID(p.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if h := region.Header(); h.RingReq != region.RingDefault() {
			t.Errorf("after the capture the rings are asked for %d events, not the default %d", h.RingReq, region.RingDefault())
		}
		region.Close()
		var s summary
		if err := json.Unmarshal(stdout.Bytes(), &s); err != nil {
			t.Fatalf("summary %q: %v", stdout.String(), err)
		}
		if o, _ := p.Finish(); !strings.HasPrefix(o, "done ") {
			t.Fatalf("program output %q", o)
		}
		if len(s.Threads) != threads {
			t.Fatalf("%d threads in the summary, want %d: %+v", len(s.Threads), threads, s)
		}
		for _, th := range s.Threads {
			if th.Events+th.Dropped != 2*calls {
				t.Errorf("thread %d: %d events kept + %d dropped, it made %d", th.Tid, th.Events, th.Dropped, 2*calls)
			}
		}
		text, err := os.ReadFile(filepath.Join(dir, "t.txt"))
		if err != nil {
			t.Fatal(err)
		}
		return s, string(text)
	}
	t.Run("default", func(t *testing.T) {
		s, text := burst(t)
		if s.Ring != 512 || s.Dropped == 0 || s.Suggested <= s.Ring {
			t.Fatalf("default rings: %+v; want drops and a bigger suggested size", s)
		}
		// The trace marks each gap on its thread, and the gaps add up to
		// the thread's drops.
		lostRe := regexp.MustCompile(`\[ *(\d+)\] \| +/\* (\d+) events lost here`)
		lost := map[int32]uint64{}
		for _, m := range lostRe.FindAllStringSubmatch(text, -1) {
			tid, _ := strconv.Atoi(m[1])
			n, _ := strconv.ParseUint(m[2], 10, 64)
			lost[int32(tid)] += n
		}
		for _, th := range s.Threads {
			if lost[th.Tid] != th.Dropped {
				t.Errorf("thread %d: the trace marks %d events lost, the summary %d", th.Tid, lost[th.Tid], th.Dropped)
			}
		}
		t.Logf("default rings: %d events dropped, capacity %d, suggested --ring-events %d", s.Dropped, s.Capacity, s.Suggested)
	})
	t.Run("ring-events", func(t *testing.T) {
		s, _ := burst(t, "--ring-events", "65536")
		if s.Ring != 65536 || s.Dropped != 0 || s.Events != 2*threads*calls {
			t.Fatalf("--ring-events 65536: %+v; want every event kept", s)
		}
		if s.Capacity < 65536 {
			t.Fatalf("capacity %d", s.Capacity)
		}
	})
}

// waitFor polls cond (a state of another process) until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
