package capture

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// Review (hostile): --args with --min-duration. The runtime writes a call's
// args record only right after its enter event, and --min-duration holds
// the enter back to the exit: no call would get its arguments, and the
// trace used to blame the ring. The combination is refused, before anything
// touches the process: a one-line usage error (exit 2, like the other
// usage errors) from the command, ErrArgs from Trace. --retval with
// --min-duration still works (its record follows the exit).
func TestReviewTraceArgsWithMinDuration(t *testing.T) {
	p, _ := startArgsLive(t, "-O0")
	defer p.Finish()
	r := testutil.Run(t, "hotpatch", "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "t_tail", "--args", "t_tail", "--retval", "t_tail",
		"--min-duration", "1ns", "--duration", "60s", "--max-calls", "10", "--format", "text")
	usage := testutil.Run(t, "hotpatch", "trace", "--pid", fmt.Sprint(p.Pid), "--duration", "0s", "--format", "text")
	if usage.Code == 0 {
		t.Fatalf("trace --duration 0s: exit 0, want a usage error")
	}
	stderr := strings.TrimSpace(r.Stderr)
	if r.Code != usage.Code || !strings.Contains(stderr, "--min-duration") || strings.Contains(stderr, "\n") || r.Stdout != "" {
		t.Errorf("--args with --min-duration: exit %d (usage errors exit %d), stdout %q, stderr %q; want one line naming --min-duration",
			r.Code, usage.Code, r.Stdout, r.Stderr)
	}
	_, err := Trace(context.Background(), Options{PID: p.Pid, Args: []string{"t_tail"}, MinDuration: time.Nanosecond, Duration: time.Second}, nil)
	if !errors.Is(err, ErrArgs) {
		t.Errorf("Trace with Args and MinDuration: %v, want ErrArgs", err)
	}
	// refused before the capture started: nothing on, no probe enabled
	allOff(t, p)
	// --retval keeps working with --min-duration
	ok := testutil.Run(t, "hotpatch", "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "t_tail", "--retval", "t_tail",
		"--min-duration", "1ns", "--duration", "60s", "--max-calls", "10", "--format", "text")
	if ok.Code != 0 || strings.Count(ok.Stdout, "| t_tail() = ") < 10 {
		t.Errorf("--retval with --min-duration: exit %d, stderr %q, want 10 t_tail calls with return values in:\n%.2000s", ok.Code, ok.Stderr, ok.Stdout)
	}
}
