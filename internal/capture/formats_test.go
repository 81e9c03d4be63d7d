package capture

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/perfetto"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestTracePerfetto: a live capture written as a Perfetto trace while
// capturing holds every call the summary counts, as slices nested on the
// tracks of the process's own threads; protoc decodes it; replay prints it.
func TestTracePerfetto(t *testing.T) {
	p := startCold(t)
	out := filepath.Join(t.TempDir(), "trace.pftrace")
	r := run(t, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "work", "--enable", "leaf", "--duration", "2s", "--max-calls", "20000", "-o", out, "--json")
	var sum struct {
		Format string `json:"format"`
		Calls  int    `json:"calls"`
		Events int    `json:"events"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &sum); err != nil {
		t.Fatalf("summary: %v: %q", err, r.Stdout)
	}
	if sum.Format != "perfetto" || sum.Calls < 20000 {
		t.Fatalf("summary %+v", sum)
	}
	tasks := map[int32]bool{}
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", p.Pid))
	for _, e := range ents {
		var tid int32
		fmt.Sscan(e.Name(), &tid)
		tasks[tid] = true
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rd := perfetto.NewReader(f)
	depth := map[int32]int{}
	slices, leafInWork, lostMarks := 0, 0, 0
	stack := map[int32][]string{}
	for {
		e, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if e.Track == nil || e.Track.Pid != int32(p.Pid) || !tasks[e.Track.Tid] {
			t.Fatalf("event on track %+v, not a thread of %d", e.Track, p.Pid)
		}
		tid := e.Track.Tid
		switch e.Type {
		case perfetto.SliceBegin:
			if e.Name == "leaf" && len(stack[tid]) > 0 && stack[tid][len(stack[tid])-1] == "work" {
				leafInWork++
			}
			stack[tid] = append(stack[tid], e.Name)
			depth[tid]++
		case perfetto.SliceEnd:
			if depth[tid] == 0 {
				t.Fatalf("thread %d: a slice ends that never began", tid)
			}
			stack[tid] = stack[tid][:len(stack[tid])-1]
			depth[tid]--
			slices++
		case perfetto.InstantEv:
			if e.Name != "edgeprobe: events lost" {
				t.Fatalf("instant %q", e.Name)
			}
			lostMarks++ // where a full ring dropped events
		}
	}
	for tid, d := range depth {
		if d != 0 {
			t.Errorf("thread %d: %d slices never end", tid, d)
		}
	}
	if slices != sum.Calls {
		t.Errorf("%d slices in the trace, summary says %d calls", slices, sum.Calls)
	}
	if leafInWork == 0 {
		t.Error("no leaf slice nested in a work slice")
	}
	// The reference decoder sees the same number of track events.
	if _, err := exec.LookPath("protoc"); err == nil {
		in, _ := os.Open(out)
		defer in.Close()
		cmd := exec.Command("protoc", "--decode_raw")
		cmd.Stdin = in
		raw, err := cmd.Output()
		if err != nil {
			t.Fatalf("protoc --decode_raw: %v", err)
		}
		n := 0
		for _, l := range strings.Split(string(raw), "\n") {
			if l == "  11 {" { // TracePacket.track_event, at packet depth
				n++
			}
		}
		if n != 2*sum.Calls+lostMarks {
			t.Errorf("protoc saw %d track events, want %d (%d calls, %d lost-event marks)", n, 2*sum.Calls+lostMarks, sum.Calls, lostMarks)
		}
	}
	rp := run(t, "replay", out)
	if got := strings.Count(rp.Stdout, "leaf();"); got == 0 || !strings.HasPrefix(rp.Stdout, "# DURATION") {
		t.Errorf("replay printed %d leaf calls: %.300s", got, rp.Stdout)
	}
	allOff(t, p)
	if o, _ := p.Finish(); !strings.Contains(o, "wrong=0") {
		t.Fatalf("program output %q", o)
	}
}

// fibTree is the text view's FUNCTION column of fib(n)'s call tree, from
// the definition of fib (calltree.c), indented by depth.
func fibTree(n, depth int, lines []string) []string {
	ind := strings.Repeat("  ", depth)
	if n < 2 {
		return append(lines, ind+"fib();")
	}
	lines = append(lines, ind+"fib() {")
	lines = fibTree(n-1, depth+1, lines)
	lines = fibTree(n-2, depth+1, lines)
	return append(lines, ind+"} /* fib */")
}

// TestTraceTextCallTree: the text view of a live recursive program shows
// exactly fib's call tree, for both providers: every tree that begins at
// depth 0 is fib(k)'s for some k (the capture may begin inside a tree),
// and most are the program's fib(5).
func TestTraceTextCallTree(t *testing.T) {
	testutil.RequirePtrace(t)
	const n = 5
	want := map[string]int{} // tree text -> k
	for k := 0; k <= n; k++ {
		want[strings.Join(fibTree(k, 0, nil), "\n")] = k
	}
	for _, spec := range []testutil.Spec{
		{Sources: []string{"calltree.c"}, Opt: "-O0"},
		{Sources: []string{"calltree.c"}, Opt: "-O0", NoInstr: true, Profile: testutil.ProfileFentry},
	} {
		t.Run(spec.String(), func(t *testing.T) {
			// Rings big enough that nothing is dropped at this rate.
			p := startColdSpec(t, spec, []string{"EDGEPROBE_RING_EVENTS=65536"}, fmt.Sprint(n))
			r := run(t, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "fib", "--duration", "60s", "--max-calls", "1000", "--format", "text", "--json")
			var sum struct {
				Dropped uint64 `json:"dropped_events"`
			}
			if err := json.Unmarshal([]byte(r.Stderr), &sum); err != nil {
				t.Fatalf("summary on stderr: %v: %q", err, r.Stderr)
			}
			if sum.Dropped != 0 {
				t.Fatalf("%d events dropped with 65536-event rings", sum.Dropped)
			}
			full, trees := 0, 0
			var cur []string
			sc := bufio.NewScanner(strings.NewReader(r.Stdout))
			for sc.Scan() {
				line := sc.Text()
				if strings.HasPrefix(line, "#") {
					continue
				}
				_, fn, ok := strings.Cut(line, "] | ")
				if !ok {
					t.Fatalf("line %q", line)
				}
				if strings.Contains(fn, "still running") {
					break // the capture ended inside this tree
				}
				cur = append(cur, fn)
				if strings.HasPrefix(fn, " ") { // inside a tree
					continue
				}
				if fn == "fib() {" && len(cur) == 1 { // a tree opens
					continue
				}
				k, ok := want[strings.Join(cur, "\n")]
				if !ok {
					t.Fatalf("tree %d is not fib's:\n%s", trees, strings.Join(cur, "\n"))
				}
				trees++
				if k == n {
					full++
				}
				cur = cur[:0]
			}
			if full < 10 {
				t.Errorf("%d complete fib(%d) trees of %d at depth 0", full, n, trees)
			}
			if o, _ := p.Finish(); !strings.HasPrefix(o, "done ") {
				t.Fatalf("program output %q", o)
			}
		})
	}
}

// TestTop: top with --enable shows per-interval rates and percentiles, one
// JSON object per interval, and puts the probes back.
func TestTop(t *testing.T) {
	p := startCold(t)
	r := run(t, "top", "--pid", fmt.Sprint(p.Pid), "--enable", "work", "--enable", "leaf", "--interval", "100ms", "--count", "3", "--json")
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d snapshots, want 3: %q", len(lines), r.Stdout)
	}
	var lastTotal uint64
	for i, l := range lines {
		var s struct {
			PID        int   `json:"pid"`
			IntervalNs int64 `json:"interval_ns"`
			Functions  []struct {
				Name       string  `json:"name"`
				Calls      uint64  `json:"calls"`
				PerSec     float64 `json:"calls_per_sec"`
				P50        uint64  `json:"p50_ns"`
				P99        uint64  `json:"p99_ns"`
				TotalCalls uint64  `json:"total_calls"`
			} `json:"functions"`
		}
		if err := json.Unmarshal([]byte(l), &s); err != nil {
			t.Fatalf("snapshot %d: %v: %q", i, err, l)
		}
		seen := 0
		for _, f := range s.Functions {
			if f.Name != "work" && f.Name != "leaf" {
				continue
			}
			seen++
			rate := float64(f.Calls) / (float64(s.IntervalNs) / 1e9)
			if f.Calls == 0 || f.P50 == 0 || f.P50 > f.P99 || (f.PerSec-rate) > 1e-6*rate || (rate-f.PerSec) > 1e-6*rate {
				t.Errorf("snapshot %d: %+v (interval %d ns)", i, f, s.IntervalNs)
			}
			if f.Name == "work" {
				if f.TotalCalls < lastTotal+f.Calls {
					t.Errorf("snapshot %d: work's total %d did not grow by its %d calls from %d", i, f.TotalCalls, f.Calls, lastTotal)
				}
				lastTotal = f.TotalCalls
			}
		}
		if s.PID != p.Pid || seen != 2 {
			t.Errorf("snapshot %d: pid %d, %d of work and leaf: %s", i, s.PID, seen, l)
		}
	}
	allOff(t, p)
	if o, _ := p.Finish(); !strings.Contains(o, "wrong=0") {
		t.Fatalf("program output %q", o)
	}
}
