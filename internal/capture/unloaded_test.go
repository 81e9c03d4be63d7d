package capture

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestProfilePluginUnloaded: the program unloads the plugin a profile has
// its probes in and loads a new build at the same address (reload.c,
// plugin.c plain and -DSWAPPED). The profile's toggles cannot reach the
// old plugin any more (D77); the profile ends there, exit 0, with a note
// and what it recorded, as when the process ends (before: its next toggle
// was refused as a stale list and the profile failed, exit 1, nothing
// written).
//
// With a quota no epoch uses up (--samples 1e9) the profile never toggles
// plug_work again after turning it on, so no toggle can find the plugin
// gone: its look every 50 ms asks whether an object it has probes in is
// still mapped (D80). Before that, that profile ran its whole --duration
// (the watchdog below; the case a loaded machine hit once with --samples
// 100: plug_work on when the plugin went).
func TestProfilePluginUnloaded(t *testing.T) {
	for _, samples := range []string{"100", "1000000000"} {
		t.Run("samples="+samples, func(t *testing.T) { profilePluginUnloaded(t, samples) })
	}
}

func profilePluginUnloaded(t *testing.T, samples string) {
	testutil.RequirePtrace(t)
	rt := testutil.Runtime(t, "gcc")
	v1 := testutil.Build(t, testutil.Spec{Sources: []string{"plugin.c"}, Shared: true, Name: "plug1.so"})
	v2 := testutil.Build(t, testutil.Spec{Sources: []string{"plugin.c"}, Shared: true, Name: "plug2.so", Flags: []string{"-DSWAPPED"}})
	list := filepath.Join(t.TempDir(), "plug1.json")
	for i, lib := range []string{v1.Path, v2.Path} {
		r := testutil.Run(t, "coldpatch", lib)
		if r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		if i == 0 {
			if err := os.WriteFile(list, []byte(r.Stdout), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	prog := testutil.Build(t, testutil.Spec{Sources: []string{"reload.c"}, NoInstr: true, LDFlags: []string{"-ldl"}})
	goFile := filepath.Join(t.TempDir(), "go")
	p := testutil.Start(t, []string{"LD_PRELOAD=" + rt}, prog.Path, v1.Path, v2.Path, goFile)
	region, err := shm.OpenPID(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	out := filepath.Join(t.TempDir(), "p.pprof")
	stdout, stderr, done := startCapture(t, region, shm.CtlQuota, "profile", "--pid", fmt.Sprint(p.Pid), "--probes", list,
		"--enable", "plug_work", "--duration", "10m", "--epoch", "50ms", "--samples", samples, "-o", out)
	// Its loop runs (the first Apply returned) once a second epoch starts.
	e0 := region.QuotaEpoch()
	waitFor(t, "the profile's second epoch", func() bool { return region.QuotaEpoch() != e0 })
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if line := p.Line(); !strings.HasPrefix(line, "reloaded ") {
		t.Fatalf("want the reloaded line, got %q", line)
	}
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		// A watchdog, not a measure: the profile asked for 10 minutes.
		t.Fatalf("the profile was still running 2 minutes after the plugin was unloaded (stderr %q)", stderr.String())
	}
	if err != nil || !strings.Contains(stderr.String(), "unloaded an object the profile had probes in") || !strings.Contains(stdout.String(), "plug_work") {
		t.Fatalf("profile: %v, stdout %q, stderr %q; want exit 0, plug_work's row and a note that the object was unloaded", err, stdout.String(), stderr.String())
	}
	if st, err := os.Stat(out); err != nil || st.Size() == 0 {
		t.Fatalf("profile file: %v", err)
	}
	if o, _ := p.Finish(); !strings.HasPrefix(o, "done 1") {
		t.Fatalf("reload: %q", o)
	}
}

// TestTraceObjectUnloaded: a trace whose program unloads the plugin it has
// probes in (reload.c, V2 "-": dlclose only) says so (D80): one line on
// stderr naming the object, `unloaded_objects` in --json, and in the
// Perfetto trace an "edgeprobe: object unloaded" instant on the process's
// track, which `hotpatch replay` prints as a line naming it. The trace goes
// on (other objects' calls are still traced) and ends as asked, exit 0.
// Before, it said nothing of it (its end only skipped the unloaded object
// when putting probes back).
func TestTraceObjectUnloaded(t *testing.T) {
	testutil.RequirePtrace(t)
	rt := testutil.Runtime(t, "gcc")
	v1 := testutil.Build(t, testutil.Spec{Sources: []string{"plugin.c"}, Shared: true, Name: "plug1.so"})
	list := testutil.ProbeList(t, filepath.Join(t.TempDir(), "plug1.json"), v1.Path)
	prog := testutil.Build(t, testutil.Spec{Sources: []string{"reload.c"}, NoInstr: true, LDFlags: []string{"-ldl"}})
	goFile := filepath.Join(t.TempDir(), "go")
	p := testutil.Start(t, []string{"LD_PRELOAD=" + rt}, prog.Path, v1.Path, "-", goFile)
	region, err := shm.OpenPID(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	out := filepath.Join(t.TempDir(), "t.pftrace")
	c := runCapture(t, "trace", "--pid", fmt.Sprint(p.Pid), "--probes", list, "--enable", "plug_work", "--duration", "10m", "-o", out, "--json")
	waitFor(t, "the trace to start", func() bool { return region.Control()&shm.CtlTrace != 0 })
	touch(t, goFile)
	if line := p.Line(); !strings.HasPrefix(line, "unloaded ") {
		t.Fatalf("want the unloaded line, got %q", line)
	}
	var sum struct {
		Calls    uint64           `json:"calls"`
		Unloaded []UnloadedObject `json:"unloaded_objects"`
	}
	c.interruptInto(t, &sum)
	if len(sum.Unloaded) != 1 || sum.Unloaded[0].Object != v1.Path || sum.Calls == 0 {
		t.Errorf("summary %q: want plug_work's calls and unloaded_objects naming %s", c.out.String(), v1.Path)
	}
	if want := "hotpatch: trace: the process unloaded " + v1.Path; !strings.Contains(c.err.String(), want) {
		t.Errorf("stderr %q: want %q", c.err.String(), want)
	}
	replay := run(t, "replay", out).Stdout
	if want := "/* the process unloaded " + v1.Path + " here"; !strings.Contains(replay, want) || !strings.Contains(replay, "plug_work") {
		t.Errorf("replay: want plug_work's calls and %q:\n%.2000s", want, replay)
	}
	if o, _ := p.Finish(); !strings.HasPrefix(o, "done ") {
		t.Fatalf("reload: %q", o)
	}
}
