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

// TestNopListOfReplacedBuild: TestListOfReplacedBuild with cold binaries
// whose sites are NOP placeholders, which a scan of the mapped object does
// not see. The list of the build now at the path (made by coldpatch
// --placeholder nop in place) was not compared with the running build:
// `--enable work` turned leaf's sites on, exit 0 (review7's F4 left this
// open). Now the running object's file, with the list's active forms put
// back where its NOPs are, is scanned and compared (docs/probe-list.md): stale, one line,
// nothing written; the running build's own list still works.
func TestNopListOfReplacedBuild(t *testing.T) {
	testutil.RequirePtrace(t)
	noID := []string{"-Wl,--build-id=none"}
	v1 := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"order.c"}, LDFlags: noID, Name: "order-v1"}).Path
	v2 := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"order.c"}, LDFlags: noID, Flags: []string{"-DSWAP"}, Name: "order-v2"}).Path
	dir := t.TempDir()
	app := filepath.Join(dir, "app")
	// A hot build put at the path (a new file renamed over it, as an
	// install does), then made cold in place with NOP placeholders; its
	// list names the path.
	coldAt := func(hot, list string) string {
		t.Helper()
		b, err := os.ReadFile(hot)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(app+".new", b, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(app+".new", app); err != nil {
			t.Fatal(err)
		}
		return testutil.ProbeList(t, filepath.Join(dir, list), app, "--placeholder", "nop")
	}
	list1 := coldAt(v1, "v1.json")
	st1, err := os.Stat(app)
	if err != nil {
		t.Fatal(err)
	}
	p := testutil.Start(t, []string{"LD_PRELOAD=" + testutil.Runtime(t, "gcc")}, app)
	pid := fmt.Sprint(p.Pid)
	list2 := coldAt(v2, "v2.json")
	if st2, err := os.Stat(app); err != nil || st2.Size() != st1.Size() {
		t.Fatalf("fixture: the two cold builds differ in size (%d, %v): the case needs them equal", st1.Size(), err)
	}
	states := func() map[string]string {
		t.Helper()
		var sites []struct{ Function, State string }
		if err := json.Unmarshal([]byte(hotpatchOK(t, "list", "--pid", pid, "--probes", list1, "--json").Stdout), &sites); err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, s := range sites {
			if m[s.Function] != "" && m[s.Function] != s.State {
				s.State = "mixed"
			}
			m[s.Function] = s.State
		}
		return m
	}
	r := testutil.Run(t, "hotpatch", "--pid", pid, "--probes", list2, "--enable", "work")
	if r.Code != 1 || r.Stdout != "" || strings.Count(r.Stderr, "\n") != 1 || !strings.Contains(r.Stderr, "stale probe list") ||
		!strings.Contains(r.Stderr, "not the build the list describes") {
		t.Errorf("--probes (NOP list of the build now at the path) --enable work: exit %d, stdout %q, stderr %q; want exit 1, one line: stale probe list, not the build the list describes", r.Code, r.Stdout, r.Stderr)
	}
	t.Logf("the stale NOP list: %s", strings.TrimSpace(r.Stderr))
	if m := states(); m["work"] != "off" || m["leaf"] != "off" {
		t.Errorf("after the stale list's --enable work: work %s, leaf %s; want both off (nothing written)", m["work"], m["leaf"])
	}
	hotpatchOK(t, "--pid", pid, "--probes", list1, "--enable", "work")
	if m := states(); m["work"] != "on" || m["leaf"] != "off" {
		t.Errorf("after the running build's list's --enable work: work %s, leaf %s; want on, off", m["work"], m["leaf"])
	}
	p.Finish()
}
