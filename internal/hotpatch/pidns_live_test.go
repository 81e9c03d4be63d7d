package hotpatch

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestPidNamespaceKilledMidPatch: TestLeaderExitedKilledMidPatch's
// "session-holds" case with the target in a pid namespace of its own, with
// its own /proc (as in a container), hotpatch outside it, given the outer
// pid. A hotpatch is SIGKILLed mid-int3; a session opened after the kill
// holds the process (the leader's seize, or the flock of /proc/PID/fd and
// an idle thread's seize once the main thread has exited); then the
// worker, which nobody traces, meets the int3. The runtime's SIGTRAP
// handler must wait while the session holds, not repair. Inside the
// namespace TracerPid names a tracer outside it as 0, and the handler's
// flock of its /proc/self/fd is another inode than the one hotpatch locked
// through the host's /proc: before (D101) the handler saw nobody and
// repaired under the session. Now hotpatch holds a flock of the runtime's
// region memfd, one inode in every namespace, which the handler checks.
// Once the session ends, the handler repairs, and the step's 1000 calls
// all ran.
func TestPidNamespaceKilledMidPatch(t *testing.T) {
	testutil.RequirePtrace(t)
	hooks := hooksLib(t)
	rt := testutil.Runtime(t, "gcc")
	fix, list := leaderFixture(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"})
	for _, mode := range []string{"leader-alive", "leader-exited"} {
		t.Run(mode, func(t *testing.T) {
			args := []string{"steps"}
			if mode == "leader-alive" {
				args = append(args, "alive")
			}
			p := testutil.StartPidNS(t, []string{"LD_PRELOAD=" + hooks + ":" + rt}, fix.Path, args...)
			if mode == "leader-exited" {
				awaitLeaderExited(t, p.Pid)
			}
			s := &subject{Process: p, probeArgs: []string{"--probes", list}}
			killMidPatch(t, s)
			ss := startSession(t, s)
			ss.send(t, "stats")
			if l := ss.read(t); !l.OK {
				t.Fatalf("session: %+v", l)
			}
			if err := os.WriteFile(p.StopFile+".1", nil, 0o644); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(time.Minute)
			for {
				_, repairs, holds := inflightCounters(t, s)
				if repairs != 0 {
					t.Fatalf("the handler repaired %d sites while a session (outside its pid namespace) held the process", repairs)
				}
				if holds > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("no thread was held by the SIGTRAP handler in a minute")
				}
				time.Sleep(time.Millisecond) // polling, not synchronisation
			}
			ss.in.Close()
			ss.wait(t)
			if l := p.Line(); l != "step 1" {
				t.Fatalf("step 1: %q", l)
			}
			traps, repairs, holds := inflightCounters(t, s)
			t.Logf("handler took %d traps, repaired %d sites, held %d", traps, repairs, holds)
			if traps == 0 || repairs == 0 {
				t.Fatalf("traps %d, repairs %d: the handler must have taken the trap and repaired once the session ended", traps, repairs)
			}
			for _, st := range listStates(t, fmt.Sprint(p.Pid), list) {
				if st.State != "on" && st.State != "off" {
					t.Fatalf("probe %d (%s %s) left %s: %s", st.ID, st.Kind, st.Function, st.State, st.Bytes)
				}
			}
			out, errOut := p.Finish()
			if !strings.HasPrefix(out, "done 1") {
				t.Fatalf("leaderexit: stdout %q, stderr %q", out, errOut)
			}
		})
	}
}
