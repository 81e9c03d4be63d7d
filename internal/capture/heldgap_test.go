package capture

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// --rate and --min-duration together. t_a -> t_b -> t_c,
// where the quota records t_a and t_c but skips t_b (its one call per epoch
// went to a top-level t_b(0) just before). t_c's exit writes its held-back
// enter and its pending callers' first; the skipped t_b's frame between
// them must not hide t_a, or t_a's enter is written after t_c's events and
// the thread's stream is no longer nested: the text view shows t_c as a
// top-level call, and t_a with no callee.
func TestTraceRateWithMinDuration(t *testing.T) {
	p := startColdSpec(t, testutil.Spec{Sources: []string{"heldgap.c"}, Opt: "-O0"}, nil)
	out := filepath.Join(t.TempDir(), "t.txt")
	run(t, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "t_*", "--rate", "1", "--min-duration", "1ns",
		"--duration", "2500ms", "--format", "text", "-o", out)
	p.Finish()
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	nested := strings.Count(text, "t_a() {")
	top := 0
	for _, l := range strings.Split(text, "\n") {
		if strings.HasSuffix(l, "| t_c();") { // no indentation: not inside t_a
			top++
		}
	}
	if top > 0 || nested == 0 {
		t.Errorf("t_c at top level %d times, t_a with a callee %d times; want t_c always inside t_a:\n%.2000s", top, nested, text)
	}
}
