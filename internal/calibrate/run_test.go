package calibrate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// tiny is the configuration the tests run: every variant, every split, a
// few hundred toggles per point.
func tiny(progress func(Progress)) Options {
	return Options{
		Waits:           []time.Duration{time.Microsecond, 0},
		TogglesPerPoint: 151, // rounded up to 152
		Threads:         2,
		Progress:        progress,
	}
}

func requireRun(t *testing.T) {
	t.Helper()
	testutil.RequirePtrace(t)
	if _, err := findCC(""); err != nil {
		testutil.Unavailable(t, "%v", err)
	}
}

// checkCounts checks what every point must satisfy whatever happened.
func checkCounts(t *testing.T, res *Result, toggles int) {
	t.Helper()
	for _, p := range res.Sweep {
		if p.Toggles != toggles {
			t.Errorf("%s wait %v split %s: %d toggles, asked %d", p.Variant, p.Wait(), p.Split, p.Toggles, toggles)
		}
		if p.Failures != p.Torn+p.Bad+p.Crashes {
			t.Errorf("%s wait %v split %s: failures %d != torn %d + bad %d + crashes %d", p.Variant, p.Wait(), p.Split, p.Failures, p.Torn, p.Bad, p.Crashes)
		}
		// The target's own reports: one stderr line per torn execution.
		if p.Reported != p.Torn {
			t.Errorf("%s wait %v split %s: the target counted %d torn executions but reported %d", p.Variant, p.Wait(), p.Split, p.Torn, p.Reported)
		}
		if p.Torn > 0 && len(p.Reports) == 0 {
			t.Errorf("%s wait %v split %s: torn executions but no report kept", p.Variant, p.Wait(), p.Split)
		}
		if p.Variant == VariantFlip && p.Held != 0 {
			t.Errorf("flip held %d threads", p.Held)
		}
	}
}

func TestRunTiny(t *testing.T) {
	requireRun(t)
	var events []Progress
	res, err := Run(context.Background(), tiny(func(p Progress) { events = append(events, p) }))
	if err != nil {
		t.Fatal(err)
	}
	var buf strings.Builder
	res.WriteTable(&buf)
	t.Logf("\n%s", buf.String())

	// The plan: flip, int3 by ascending wait, int3+sync; splits 1..4 each.
	var want []string
	for _, v := range []string{"flip/none", "int3/none", "int3/1µs", "int3+sync/none"} {
		for _, s := range []string{"1|4", "2|3", "3|2", "4|1"} {
			want = append(want, v+"/"+s)
		}
	}
	var got []string
	for _, p := range res.Sweep {
		got = append(got, fmt.Sprintf("%s/%s/%s", p.Variant, WaitString(p.Wait()), p.Split))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("sweep:\n got %v\nwant %v", got, want)
	}
	checkCounts(t, res, 152)
	if f := res.Failures(VariantFlip); f != 0 {
		t.Errorf("flip: %d failures", f)
	}
	// Progress: a start and a completion per point, in order, completions
	// carrying the final point.
	done := 0
	for _, e := range events {
		if e.Total != len(res.Sweep) {
			t.Fatalf("progress total %d, sweep %d", e.Total, len(res.Sweep))
		}
		if e.Done {
			if e.Index != done {
				t.Fatalf("completion of point %d, expected %d", e.Index, done)
			}
			if p := res.Sweep[e.Index]; e.Point.Toggles != p.Toggles || e.Point.Failures != p.Failures {
				t.Errorf("progress for point %d: %+v, sweep has %+v", e.Index, e.Point, p)
			}
			done++
		}
	}
	if done != len(res.Sweep) {
		t.Errorf("%d completions reported for %d points", done, len(res.Sweep))
	}
	for _, p := range res.Sweep {
		if p.Variant != VariantFlip && p.Held == 0 {
			t.Logf("note: %s wait %v split %s never held an executor", p.Variant, p.Wait(), p.Split)
		}
	}
	if res.Machine.NProc == 0 || res.Machine.Kernel == "" || res.Date == "" || res.Threads != 2 || res.TogglesPerPoint != 152 {
		t.Errorf("result header: %+v", res)
	}
	// The choice, given the data.
	if res.Failures(VariantInt3) == 0 {
		if !res.Safe || res.BaseWaitNs != int64(time.Microsecond) || res.WaitNs != int64(3*time.Microsecond) || res.BaseToggles != 4*152 {
			t.Errorf("no int3 failures, yet base %d wait %d safe %v base toggles %d", res.BaseWaitNs, res.WaitNs, res.Safe, res.BaseToggles)
		}
		path := filepath.Join(t.TempDir(), "sub", "calibration.json")
		if err := res.Save(path); err != nil {
			t.Fatal(err)
		}
		d, ok, err := Load(path)
		if err != nil || !ok || d != 3*time.Microsecond {
			t.Errorf("Load after Save: %v %v %v", d, ok, err)
		}
	} else {
		t.Logf("int3 (NoSync) failed %d times in this tiny run", res.Failures(VariantInt3))
	}
}

// A torn execution injected into the running target (an invalid opcode at
// a site the executors run but the sweep does not toggle) is counted by the
// target's handler, reported with its bytes, and attributed to the point.
func TestRunCountsTargetReports(t *testing.T) {
	requireRun(t)
	injected := false
	testHook = func(tg *target, p *Point) {
		if injected || p.Variant != VariantInt3 || p.Toggles != 20 {
			return
		}
		injected = true
		// 0x06 (push es) is invalid in 64-bit mode: #UD, SIGILL.
		a := tg.addr("stress_site0")
		if err := tg.mem.WriteMem(a, []byte{0x06}); err != nil {
			t.Error(err)
			return
		}
		// Poll the target's counter until its handler has run at least
		// once, then put the call back.
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			torn, _, err := tg.counters()
			if err != nil {
				t.Error(err)
				break
			}
			if torn > 0 {
				break
			}
			time.Sleep(100 * time.Microsecond) // polling interval
		}
		if err := tg.mem.WriteMem(a, []byte{0xe8}); err != nil {
			t.Error(err)
		}
	}
	defer func() { testHook = nil }()
	o := tiny(nil)
	o.Waits = []time.Duration{time.Microsecond}
	o.Splits = []int{2}
	o.SkipSync, o.SkipFlip = true, true
	o.TogglesPerPoint = 100
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if !injected || len(res.Sweep) != 1 {
		t.Fatalf("injected %v, sweep %+v", injected, res.Sweep)
	}
	checkCounts(t, res, 100)
	p := res.Sweep[0]
	if p.Torn == 0 || p.Failures < p.Torn || p.Crashes != 0 {
		t.Fatalf("point %+v: want torn executions counted, no crash", p)
	}
	// The handler reads the code bytes when it runs: the test may have put
	// the call back by then.
	if !strings.HasPrefix(p.Reports[0], "torn sig=4 ") || !strings.Contains(p.Reports[0], " site=0 ") ||
		!(strings.Contains(p.Reports[0], " code=06 ") || strings.Contains(p.Reports[0], " code=e8 ")) {
		t.Errorf("report %q: want sig=4 (SIGILL), site=0, code=06 (or e8) ...", p.Reports[0])
	}
	if res.Safe {
		t.Errorf("a sweep whose only wait failed is safe: %+v", res)
	}
	t.Logf("%d torn, first report %q", p.Torn, p.Reports[0])
}

// A target that dies is a failure of its point, and is restarted: the
// point and the sweep go on.
func TestRunTargetDeath(t *testing.T) {
	requireRun(t)
	killed := 0
	testHook = func(tg *target, p *Point) {
		if killed == 0 && p.Variant == VariantInt3 && p.Split == "3|2" && p.Toggles == 30 {
			killed = tg.pid
			if err := syscall.Kill(tg.pid, syscall.SIGKILL); err != nil {
				t.Error(err)
			}
		}
	}
	defer func() { testHook = nil }()
	o := tiny(nil)
	o.Waits = []time.Duration{time.Microsecond}
	o.Splits = []int{2, 3, 4}
	o.SkipSync = true
	o.TogglesPerPoint = 100
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if killed == 0 {
		t.Fatal("the hook never ran")
	}
	var buf strings.Builder
	res.WriteTable(&buf)
	t.Logf("\n%s", buf.String())
	for _, p := range res.Sweep {
		if p.Toggles != 100 {
			t.Errorf("%s %s: %d toggles", p.Variant, p.Split, p.Toggles)
		}
		if p.Failures != p.Torn+p.Bad+p.Crashes {
			t.Errorf("%s %s: failures %d != %d+%d+%d", p.Variant, p.Split, p.Failures, p.Torn, p.Bad, p.Crashes)
		}
		dead := p.Variant == VariantInt3 && p.Split == "3|2"
		if dead != (p.Crashes == 1) {
			t.Errorf("%s %s: %d crashes", p.Variant, p.Split, p.Crashes)
		}
		if dead {
			last := p.Reports[len(p.Reports)-1]
			if !strings.Contains(last, "target died (") {
				t.Errorf("crash report %q", last)
			}
		}
	}
	if !strings.Contains(buf.String(), "!") || res.Safe {
		t.Errorf("a crashed point must show and must not qualify: safe %v", res.Safe)
	}
}

func TestNoCompiler(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv("CC", "")
	_, err := Run(context.Background(), Options{})
	if !errors.Is(err, ErrNoCompiler) || !strings.Contains(err.Error(), "install gcc or clang") {
		t.Fatalf("got %v", err)
	}
	_, err = Run(context.Background(), Options{CC: "/nonexistent/cc"})
	if !errors.Is(err, ErrNoCompiler) {
		t.Fatalf("got %v", err)
	}
}

func TestOptionsErrors(t *testing.T) {
	for _, o := range []Options{
		{Waits: []time.Duration{-1}},
		{Waits: []time.Duration{2 * time.Second}},
		{Threads: 65},
		{Threads: -1},
		{Splits: []int{5}},
		{Splits: []int{}},
		{Margin: 0.5},
		{TogglesPerPoint: -2},
	} {
		if _, err := Run(context.Background(), o); err == nil || !strings.HasPrefix(err.Error(), "calibrate: ") {
			t.Errorf("%+v: got %v", o, err)
		}
	}
}

// TestCalibrateSoak runs a real calibration with the default sweep when
// EDGEPROBE_CALIBRATE_TOGGLES (toggles per point) is set, printing progress
// and the table; with EDGEPROBE_CALIBRATE_OUT it also saves the result
// there. Example:
//
//	EDGEPROBE_CALIBRATE_TOGGLES=20000 go test -v -timeout 1h -run TestCalibrateSoak ./internal/calibrate
func TestCalibrateSoak(t *testing.T) {
	n := testutil.OptIn(t, "EDGEPROBE_CALIBRATE_TOGGLES", "calibration soak (toggles per point)")
	requireRun(t)
	toggles, err := strconv.Atoi(n)
	if err != nil {
		t.Fatalf("EDGEPROBE_CALIBRATE_TOGGLES=%q: %v", n, err)
	}
	res, err := Run(context.Background(), Options{TogglesPerPoint: toggles, Progress: func(p Progress) {
		if p.Done {
			t.Logf("[%d/%d %v] %s wait %s split %s: %d/%d failures, held %d, stale %d, %v",
				p.Index+1, p.Total, p.Elapsed.Round(time.Second), p.Point.Variant, WaitString(p.Point.Wait()), p.Point.Split,
				p.Point.Failures, p.Point.Toggles, p.Point.Held, p.Point.StaleTraps, time.Duration(p.Point.ElapsedNs).Round(time.Millisecond))
		}
	}})
	if res != nil {
		var b strings.Builder
		res.WriteTable(&b)
		t.Logf("\n%s", b.String())
		for _, p := range res.Sweep {
			for _, r := range p.Reports {
				t.Logf("%s wait %s split %s: %s", p.Variant, WaitString(p.Wait()), p.Split, r)
			}
		}
		if out := os.Getenv("EDGEPROBE_CALIBRATE_OUT"); out != "" {
			js, _ := res.Marshal()
			if err := os.WriteFile(out, js, 0o644); err != nil {
				t.Error(err)
			}
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if f := res.Failures(VariantFlip); f != 0 {
		t.Errorf("flip: %d failures", f)
	}
}
