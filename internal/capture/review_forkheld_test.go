package capture

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestTraceForkWithHeldEnters (review, hostile): fork from inside probed
// calls whose enters a --min-duration trace holds back, with --rate quotas
// on. The children (which run the runtime's hooks and destructor on their
// own region) exit 0; the parent's trace stays nested (every t_outer holds
// its t_mid) and never shows a child's call.
func TestTraceForkWithHeldEnters(t *testing.T) {
	p := startColdSpec(t, testutil.Spec{Sources: []string{"forkheld.c"}, Opt: "-O0"}, nil)
	out := filepath.Join(t.TempDir(), "t.txt")
	run(t, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "t_*", "--rate", "100000", "--min-duration", "1ns",
		"--duration", "60s", "--max-calls", "40", "--format", "text", "-o", out)
	stdout, _ := p.Finish()
	if !strings.Contains(stdout, "bad=0") {
		t.Errorf("program output %q: a child failed", stdout)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	outer := strings.Count(text, "| t_outer() {")
	if outer < 10 || strings.Count(text, "  t_mid();") < outer-1 || strings.Contains(text, "t_child") {
		t.Errorf("%d nested t_outer calls; want t_mid inside each and no t_child:\n%.2000s", outer, text)
	}
}
