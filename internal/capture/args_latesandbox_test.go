package capture

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// Hostile: a program that enters a seccomp sandbox (libc's prctl) while a
// capture copies its char * arguments, with a filter that kills it at its
// next process_vm_readv. The capture checked for seccomp when it started
// (TestTraceArgsSeccomp) and its per-drain check comes a drain period late;
// the preloaded runtime's prctl interposer (runtime/edgeprobe_seccomp.c)
// turns the hooks' string copies off before the filter exists. A capture
// must never kill its target.
func TestArgsLateSandbox(t *testing.T) {
	testutil.RequirePtrace(t)
	lib := testutil.Runtime(t, "gcc")
	fx := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"sandboxlate.c"}, Profile: testutil.ProfileFentry, NoInstr: true})
	if r := testutil.Run(t, "coldpatch", fx.Path); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	dir := t.TempDir()
	goFile := filepath.Join(dir, "go")
	p := testutil.Start(t, []string{"LD_PRELOAD=" + lib}, fx.Path, goFile)
	region, err := shm.OpenPID(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	cmd := exec.Command(testutil.Command(t, "hotpatch"), "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "t_str", "--args", "t_str",
		"--duration", "2s", "--format", "text", "-o", filepath.Join(dir, "t.txt"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the capture to record arguments", func() bool { return region.Control()&shm.CtlArgs != 0 })
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if err := os.WriteFile(p.StopFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(); err != nil {
		t.Fatalf("the target entered its sandbox during an --args capture and died: %v (capture stderr %q)", err, stderr.String())
	}
}
