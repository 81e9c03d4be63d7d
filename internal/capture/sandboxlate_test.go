package capture

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// A program that enters a seccomp sandbox while an --args capture copies
// its strings: the capture sees it at its next look (each drain), turns the
// string copies off in the runtime's plans and says so; later calls show
// their char * as a pointer. The filter here makes process_vm_readv fail
// (EPERM) rather than kill, so that calls in the window between the
// filter and that look could do no harm where the runtime's own prctl
// interposer does not apply (docs/tracing.md); TestArgsLateSandbox is the
// killing filter, which the preloaded runtime's interposer stops.
func TestTraceArgsLateSandboxStopsCopies(t *testing.T) {
	testutil.RequirePtrace(t)
	lib := testutil.Runtime(t, "gcc")
	fx := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"sandboxlate.c"}, Profile: testutil.ProfileFentry, NoInstr: true})
	if r := testutil.Run(t, "coldpatch", fx.Path); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	dir := t.TempDir()
	goFile := filepath.Join(dir, "go")
	p := testutil.Start(t, []string{"LD_PRELOAD=" + lib}, fx.Path, goFile, "eperm")
	region, err := shm.OpenPID(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	out := filepath.Join(dir, "t.txt")
	cmd := exec.Command(testutil.Command(t, "hotpatch"), "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "t_str", "--args", "t_str",
		"--duration", "5m", "--format", "text", "-o", out)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := testutil.StartBound(cmd); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	calls := func() (n uint64) {
		for _, f := range region.Functions() {
			n += f.Entries
		}
		return n
	}
	waitFor(t, "the capture to record arguments", func() bool { return region.Control()&shm.CtlArgs != 0 })
	n0 := calls()
	waitFor(t, "calls with the strings copied", func() bool { return calls() >= n0+20 })
	if !region.ArgStrings() {
		t.Fatal("the plans copy no strings before the sandbox")
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the capture to turn the string copies off", func() bool { return !region.ArgStrings() })
	n1 := calls()
	waitFor(t, "calls after that", func() bool { return calls() >= n1+20 })
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("trace: %v: %s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "entered a seccomp filter during the capture") {
		t.Errorf("the capture did not say why strings stopped: %q", stderr.String())
	}
	if _, errOut := p.Finish(); !strings.Contains(errOut, "sandboxed") {
		t.Errorf("the program did not enter its sandbox: %q", errOut)
	}
	text, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`t_str\(id=\d+, s=([^)]*)\)`)
	all := line.FindAllStringSubmatch(string(text), -1)
	if len(all) < 40 {
		t.Fatalf("%d t_str calls with arguments in:\n%.2000s", len(all), text)
	}
	if first := all[0][1]; first != `"abc"` {
		t.Errorf("first call's string: %s, want \"abc\" (copied before the sandbox)", first)
	}
	ptr := regexp.MustCompile(`^0x[0-9a-f]+$`)
	tail := 0
	for i := len(all) - 1; i >= 0 && ptr.MatchString(all[i][1]); i-- {
		tail++
	}
	if tail < 20 {
		t.Errorf("the last %d calls show a bare pointer, want at least the 20 made after the copies were turned off; last: %q", tail, all[len(all)-1][0])
	}
}
