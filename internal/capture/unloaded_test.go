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
func TestProfilePluginUnloaded(t *testing.T) {
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
		"--enable", "plug_work", "--duration", "10m", "--epoch", "50ms", "--samples", "100", "-o", out)
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
