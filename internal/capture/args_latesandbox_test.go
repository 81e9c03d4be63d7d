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
func TestArgsLateSandbox(t *testing.T) { lateSandbox(t, "") }

// The same filter installed with syscall(SYS_seccomp, ...), as libseccomp
// does: the runtime's syscall interposer.
func TestArgsLateSandboxSyscall(t *testing.T) { lateSandbox(t, "sys") }

// The same with a filter the kernel refuses (EINVAL): the runtime stopped
// copying before the call (it cannot know the outcome), the capture never
// sees a filter, and the calls after it must still show their char * as a
// pointer rather than as values the runtime failed to record.
func TestArgsRefusedSandbox(t *testing.T) { lateSandbox(t, "bad") }

// mode: the fixture's third argument ("": prctl).
func lateSandbox(t *testing.T, mode string) {
	refused := mode == "bad"
	testutil.RequirePtrace(t)
	lib := testutil.Runtime(t, "gcc")
	fx := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"sandboxlate.c"}, Profile: testutil.ProfileFentry, NoInstr: true})
	if r := testutil.Run(t, "coldpatch", fx.Path); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	dir := t.TempDir()
	goFile := filepath.Join(dir, "go")
	args := []string{goFile}
	if mode != "" {
		args = append(args, mode)
	}
	p := testutil.Start(t, []string{"LD_PRELOAD=" + lib}, fx.Path, args...)
	region, err := shm.OpenPID(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	cmd := exec.Command(testutil.Command(t, "hotpatch"), "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "t_str", "--args", "t_str",
		// rings that hold the whole capture (about 30,000 events a second):
		// a drain delayed on a loaded machine must not cost a record
		"--duration", "2s", "--ring-events", "65536", "--format", "text", "-o", filepath.Join(dir, "t.txt"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := testutil.StartBound(cmd); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the capture to record arguments", func() bool { return region.Control()&shm.CtlArgs != 0 })
	// Some calls recorded with their strings before the sandbox: each is an
	// ENTER, its record (two slots with "abc") and an EXIT in the ring.
	heads := func() (n uint64) {
		for _, th := range region.Threads() {
			if th.Tid == int32(p.Pid) {
				n += th.RingHead
			}
		}
		return n
	}
	h0 := heads()
	waitFor(t, "calls recorded before the sandbox", func() bool { return heads() >= h0+20 })
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("capture: %v: %s", err, stderr.String())
	}
	out, err := os.ReadFile(filepath.Join(dir, "t.txt"))
	if err != nil {
		t.Fatal(err)
	}
	// Every call shows its string until the sandbox, then the bare pointer
	// (never "not recorded": a record without the string is a pointer), and
	// copies never come back.
	strs, ptrs := 0, 0
	for _, l := range strings.Split(string(out), "\n") {
		if !strings.Contains(l, "t_str(") {
			continue
		}
		switch {
		case strings.Contains(l, `s="abc"`) && ptrs == 0:
			strs++
		case strings.Contains(l, "s=0x"):
			ptrs++
		default:
			t.Fatalf("unexpected call after %d strings and %d pointers: %q", strs, ptrs, l)
		}
	}
	if refused && strings.Contains(stderr.String(), "seccomp") {
		t.Errorf("the capture reports a seccomp filter the kernel refused: %q", stderr.String())
	}
	if strs == 0 || ptrs == 0 {
		t.Fatalf("%d calls with the string, %d with a bare pointer; want both (capture stderr %q)", strs, ptrs, stderr.String())
	}
	if err := os.WriteFile(p.StopFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(); err != nil {
		t.Fatalf("the target entered its sandbox during an --args capture and died: %v (capture stderr %q)", err, stderr.String())
	}
}
