package capture

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// Review (hostile): a capture SIGKILLed while the runtime's quota (profile,
// trace --rate) or trace filters (--max-depth) are on leaves their control
// bits set in the target. The next capture that does not ask for them must
// not inherit them: a trace without --rate must see every call, a trace
// without --max-depth every depth. Meanwhile `stats` (table and --json)
// warns that the bits are on with no capture running.
func TestReviewTraceAfterKilledQuotaOrFilter(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		bit  uint32
	}{
		{"profile", []string{"profile", "--samples", "5", "--epoch", "1h", "--duration", "5m", "-o", "x.pprof"}, shm.CtlQuota},
		{"trace-rate", []string{"trace", "--enable", "work", "--enable", "leaf", "--rate", "5", "--duration", "5m", "-o", "x.json"}, shm.CtlQuota},
		{"trace-depth", []string{"trace", "--enable", "work", "--enable", "leaf", "--max-depth", "1", "--duration", "5m", "-o", "x.json"}, shm.CtlFilter},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := startCold(t)
			region, err := shm.OpenPID(p.Pid)
			if err != nil {
				t.Fatal(err)
			}
			defer region.Close()
			dir := t.TempDir()
			args := append([]string{c.args[0], "--pid", fmt.Sprint(p.Pid)}, c.args[1:]...)
			args[len(args)-1] = filepath.Join(dir, args[len(args)-1])
			cmd := exec.Command(testutil.Command(t, "hotpatch"), args...)
			if err := testutil.StartBound(cmd); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the capture to turn its bit on", func() bool { return region.Control()&c.bit != 0 })
			cmd.Process.Kill()
			cmd.Wait()
			var st struct {
				LeftOn []string `json:"left_on_by_killed_capture"`
			}
			r := run(t, "stats", "--pid", fmt.Sprint(p.Pid), "--json")
			if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
				t.Fatalf("stats --json: %v", err)
			}
			if len(st.LeftOn) == 0 {
				t.Errorf("stats --json after the killed %s (control %#x): no left_on_by_killed_capture", c.name, region.Control())
			}
			if r := run(t, "stats", "--pid", fmt.Sprint(p.Pid)); !strings.Contains(r.Stdout, "warning: left on by a capture killed") {
				t.Errorf("stats after the killed %s: no warning in\n%s", c.name, r.Stdout)
			}
			out := filepath.Join(dir, "next.json")
			run(t, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "work", "--enable", "leaf",
				"--duration", "20s", "--max-calls", "400", "-o", out)
			n := map[string]int{}
			for _, s := range chromeCalls(t, out) {
				n[s.Name]++
			}
			if n["work"] < 100 || n["leaf"] < 100 {
				t.Errorf("the trace after the killed %s saw work %d, leaf %d calls (control now %#x); want the 400 calls unfiltered",
					c.name, n["work"], n["leaf"], region.Control())
			}
			if ctl := region.Control(); ctl&(shm.CtlQuota|shm.CtlFilter) != 0 {
				t.Errorf("control %#x after the next capture: the killed capture's bits are still on", ctl)
			}
			if r := run(t, "stats", "--pid", fmt.Sprint(p.Pid)); strings.Contains(r.Stdout, "warning: left on") {
				t.Errorf("stats after the next capture still warns:\n%s", r.Stdout)
			}
			p.Finish()
		})
	}
}
