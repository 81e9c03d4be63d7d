package testutil

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestUnavailable runs helperUnavailable in a child test binary: a skip
// outside CI, a failure with CI=true; an opt-in test skips in CI too.
func TestUnavailable(t *testing.T) {
	if os.Getenv("TESTUTIL_HELPER") != "" {
		return
	}
	for _, c := range []struct {
		helper, ci string
		fail       bool
		want       string
	}{
		{"unavailable", "", false, "--- SKIP"},
		{"unavailable", "true", true, "cannot run in CI: gizmo is missing"},
		{"unavailable", "1", true, "cannot run in CI"},
		{"unavailable", "false", false, "--- SKIP"},
		{"optin", "true", false, "opt-in soak: set EDGEPROBE_TESTUTIL_NEVER_SET to run it"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelper$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTUTIL_HELPER="+c.helper, "CI="+c.ci)
		out, err := cmd.CombinedOutput()
		if failed := err != nil; failed != c.fail || !strings.Contains(string(out), c.want) {
			t.Errorf("%s with CI=%q: failed %v, want %v; output lacks %q?\n%s", c.helper, c.ci, failed, c.fail, c.want, out)
		}
	}
}

func TestHelper(t *testing.T) {
	switch os.Getenv("TESTUTIL_HELPER") {
	case "unavailable":
		Unavailable(t, "gizmo is missing")
	case "optin":
		OptIn(t, "EDGEPROBE_TESTUTIL_NEVER_SET", "soak")
	}
}
