package hotpatch

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestWorkerTraced: a worker thread (not the main one) is traced by strace.
// The lock (the main thread's seize) is free, so flip works; an int3
// protocol, which needs every thread, must refuse in one line that names
// the thread and its tracer, having written nothing. Before, it waited out
// its stop timeout for the tracer to let go (the case of a tracer that is
// detaching) and then said `attach to pid N: thread list did not settle
// after 4017 scans`, which names neither.
func TestWorkerTraced(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireTool(t, "strace")
	s := startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "nop", true)
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", s.Pid))
	if err != nil {
		t.Fatal(err)
	}
	worker := 0
	for _, e := range ents {
		if tid, _ := strconv.Atoi(e.Name()); tid != s.Pid && tid > 0 {
			worker = tid
			break
		}
	}
	if worker == 0 {
		t.Fatal("mt.c runs no worker thread")
	}
	st := exec.Command("strace", "-p", strconv.Itoa(worker), "-o", filepath.Join(t.TempDir(), "strace.out"))
	if err := testutil.StartBound(st); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Process.Kill(); st.Wait() })
	for deadline := time.Now().Add(time.Minute); procfs.TracerPid(worker, 0) <= 0; time.Sleep(time.Millisecond) { // polling, not synchronisation
		if time.Now().After(deadline) {
			t.Fatalf("strace did not attach to thread %d in a minute", worker)
		}
	}
	pid := fmt.Sprint(s.Pid)
	r := command(t, "hotpatch", append([]string{"--pid", pid, "--protocol", "int3", "--enable", "*"}, s.probeArgs...)...)
	if r.Code != 1 || r.Stdout != "" || strings.Count(r.Stderr, "\n") != 1 ||
		!strings.Contains(r.Stderr, fmt.Sprintf("thread %d", worker)) || !strings.Contains(r.Stderr, fmt.Sprintf("pid %d (strace)", st.Process.Pid)) {
		t.Errorf("int3 with a worker traced by strace: exit %d, stdout %q, stderr %q; want exit 1, one line naming thread %d and pid %d (strace)",
			r.Code, r.Stdout, r.Stderr, worker, st.Process.Pid)
	}
	s.expectFrozen(t, "after the refused int3 enable")
	st.Process.Kill()
	st.Wait()
	s.hotpatch(t, "--protocol", "int3", "--enable", "*")
	s.expectMoving(t, "int3 enable once strace is gone", true, true)
	s.finish(t)
}
