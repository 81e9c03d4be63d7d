package inject_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/inject"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestLoadDlopenFails: a runtime the target's dlopen refuses (it needs a
// library that is gone) is a refused load that says dlopen's own reason in
// one line, and the process runs on untouched. The reason is dlerror()'s
// string, which glibc frees when the loader's thread exits: the loader
// copies it into the data block before it ends, where hotpatch reads it
// (it used to read the freed string: an empty or garbage message).
func TestLoadDlopenFails(t *testing.T) {
	testutil.RequirePtrace(t)
	srcs, hdrs := testutil.RuntimeFiles(t)
	rel := func(names []string) []string {
		out := make([]string, len(names))
		for i, n := range names {
			out[i] = "../../runtime/" + n // fixture paths are relative to testdata/fixtures
		}
		return out
	}
	gone := testutil.Build(t, testutil.Spec{Sources: []string{"lib.c"}, Shared: true, NoInstr: true, Name: "libepgone.so"}).Path
	rt := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: rel(srcs), Deps: rel(hdrs), Shared: true, NoInstr: true,
		Flags: testutil.RuntimeFlags, LDFlags: []string{"-Wl,--no-as-needed", gone}, Name: "libedgeprobe-needs-gone.so"}).Path
	if err := os.Remove(gone); err != nil {
		t.Fatal(err)
	}
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"mt.c"}})
	p := testutil.Start(t, nil, fx.Path)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d %s", helperEnv, p.Pid, rt))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	msg := strings.TrimSpace(stderr.String())
	if err == nil || strings.Contains(msg, "\n") || !strings.Contains(msg, inject.ErrLoad.Error()) ||
		!strings.Contains(msg, "libepgone.so: cannot open shared object file") {
		t.Errorf("load of a runtime dlopen refuses: %v, stderr %q; want one line with dlopen's reason and %q", err, msg, inject.ErrLoad)
	}
	after, ierr := inject.Inspect(p.Pid)
	if ierr != nil {
		t.Fatal(ierr)
	}
	if after.Runtime != nil {
		t.Errorf("a runtime is mapped after a refused load: %+v", after.Runtime)
	}
	for _, s := range after.Slots {
		if s.State == inject.SlotRouted {
			t.Errorf("slot %s %s routed by a load that failed", s.Object, s.Hook)
		}
	}
	p.AwaitProgress(p.Symbol(fx.Path, "progress"), 100000)
	if out, _ := p.Finish(); !strings.Contains(out, "wrong=0") {
		t.Fatalf("program output %q", out)
	}
}
