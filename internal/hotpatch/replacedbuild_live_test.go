package hotpatch

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestListOfReplacedBuild: a program without a build-id runs; another build
// of the same size (functions in another order) is put at its path, and a
// probe list made for the file now at the path is given to hotpatch. The
// list matched by path and size, every selected site's bytes matched (the
// same hook call at the same address), and `--disable work` turned off
// leaf's sites in the running image, exit 0. Now the list is compared with
// the scan of the mapped object and refused as stale in one line; the scan
// path (no list) and a list of the running build still work.
func TestListOfReplacedBuild(t *testing.T) {
	testutil.RequirePtrace(t)
	noID := []string{"-Wl,--build-id=none"}
	v1 := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"order.c"}, LDFlags: noID, Name: "order-v1"}).Path
	v2 := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"order.c"}, LDFlags: noID, Flags: []string{"-DSWAP"}, Name: "order-v2"}).Path
	b1, err := os.ReadFile(v1)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := os.ReadFile(v2)
	if err != nil {
		t.Fatal(err)
	}
	if len(b1) != len(b2) {
		t.Fatalf("fixture: the two builds differ in size (%d, %d bytes): the case needs them equal", len(b1), len(b2))
	}
	dir := t.TempDir()
	app := filepath.Join(dir, "app")
	put := func(b []byte) { // a new file renamed over the path, as an install does
		t.Helper()
		if err := os.WriteFile(app+".new", b, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(app+".new", app); err != nil {
			t.Fatal(err)
		}
	}
	put(b1)
	p := testutil.Start(t, []string{"LD_PRELOAD=" + testutil.Runtime(t, "gcc")}, app)
	pid := fmt.Sprint(p.Pid)

	put(b2)
	list2 := testutil.ProbeList(t, filepath.Join(dir, "v2.json"), app, "--dry-run")
	r := testutil.Run(t, "hotpatch", "--pid", pid, "--probes", list2, "--disable", "work")
	if r.Code != 1 || r.Stdout != "" || strings.Count(r.Stderr, "\n") != 1 || !strings.Contains(r.Stderr, "stale probe list") ||
		!strings.Contains(r.Stderr, "not the build the list describes") {
		t.Errorf("--probes (list of the build now at the path) --disable work: exit %d, stdout %q, stderr %q; want exit 1, one line: stale probe list, not the build the list describes", r.Code, r.Stdout, r.Stderr)
	}

	put(b1) // the running build's bytes again, a new file
	list1 := testutil.ProbeList(t, filepath.Join(dir, "v1.json"), app, "--dry-run")
	hotpatchOK(t, "--pid", pid, "--probes", list1, "--disable", "work")
	// What is off is work, not leaf: the scan path (the mapped object)
	// says so.
	var sites []struct{ Function, State string }
	if err := json.Unmarshal([]byte(hotpatchOK(t, "list", "--pid", pid, "--json").Stdout), &sites); err != nil {
		t.Fatal(err)
	}
	for _, s := range sites {
		if s.Function == "work" && s.State != "off" || s.Function == "leaf" && s.State != "on" {
			t.Errorf("after --disable work, %s's site is %s", s.Function, s.State)
		}
	}
	p.Finish()
}
