//go:build reviewbugs

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

// Review (hostile): a program that enters a seccomp sandbox while a capture
// copies its char * arguments. The capture checked for seccomp when it
// started (TestTraceArgsSeccomp) and found none; the filter installed after
// that kills the process at the next process_vm_readv. A capture must
// never kill its target.
func TestReviewArgsLateSandbox(t *testing.T) {
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
