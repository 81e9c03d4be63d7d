package shm

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestRegionTruncated: a program that truncates its own runtime region
// while hotpatch (as root, reading another user's process: the case that
// matters) has it mapped made hotpatch's next read of it a SIGBUS: `trace`
// died with "fatal error: fault", exit 2, a goroutine dump, nothing
// restored. The runtime now seals its memfd against shrinking (the
// truncate fails, EPERM) and hotpatch maps only a region so sealed; the
// trace ends as usual.
func TestRegionTruncated(t *testing.T) {
	testutil.RequirePtrace(t)
	bin := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"truncregion.c"}}).Path
	p := testutil.Start(t, []string{"LD_PRELOAD=" + buildRuntime(t, "gcc")}, bin)
	out := filepath.Join(t.TempDir(), "t.json")
	hp := exec.Command(testutil.Command(t, "hotpatch"), "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "work", "--duration", "3s", "-o", out)
	var stderr bytes.Buffer
	hp.Stderr = &stderr
	if err := testutil.StartBound(hp); err != nil {
		t.Fatal(err)
	}
	// The trace has the region mapped once it has turned tracing on.
	r, err := OpenPID(p.Pid)
	if err != nil {
		hp.Process.Kill()
		hp.Wait()
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for r.Control()&CtlTrace == 0 {
		if time.Now().After(deadline) {
			r.Close()
			hp.Process.Kill()
			hp.Wait()
			t.Fatalf("the trace did not turn tracing on within a minute (stderr %q)", stderr.String())
		}
		runtime.Gosched()
	}
	r.Close()
	if err := syscall.Kill(p.Pid, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	line := p.Line()
	err = hp.Wait()
	if err != nil || strings.Contains(stderr.String(), "fatal error") {
		t.Errorf("trace, the region truncated under it (%s): %v, stderr %.300q", line, err, stderr.String())
	}
	if line != fmt.Sprintf("truncate %d", int(unix.EPERM)) {
		t.Errorf("the program's truncate of its region: %q, want refused (EPERM)", line)
	}
	if rest, _ := p.Finish(); !strings.Contains(rest, "done") {
		t.Errorf("the program: %q", rest)
	}
}

// TestRegionSealChecked: openTrusted's check, on memfds of this process:
// one sealed against shrinking passes, one without the seal is refused
// as untrusted (a region of an older runtime, or a planted one).
func TestRegionSealChecked(t *testing.T) {
	for _, sealed := range []bool{true, false} {
		fd, err := unix.MemfdCreate(MemfdName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		if sealed {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
				t.Fatal(err)
			}
		}
		err = checkSealed(fd)
		unix.Close(fd)
		if sealed && err != nil || !sealed && err == nil {
			t.Errorf("sealed=%v: %v", sealed, err)
		}
	}
}
