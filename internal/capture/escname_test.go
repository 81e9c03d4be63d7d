package capture

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestHostileNamesEscaped: a program whose function name carries terminal
// controls (escname.c: an OSC that retitles the window, BEL, a CSI that
// clears the screen) is listed, enabled, counted, traced, watched and
// replayed with the name escaped: no output of hotpatch for a person holds
// a control byte but newlines, and each shows the escaped name.
func TestHostileNamesEscaped(t *testing.T) {
	testutil.RequireTool(t, "clang")
	p := startColdSpec(t, testutil.Spec{Compiler: "clang", Opt: "-O2", Sources: []string{"escname.c"}}, nil)
	pid := fmt.Sprint(p.Pid)
	const escaped = `ev\x1b]0;PWNED\x07il\x1b[2J`
	pf := filepath.Join(t.TempDir(), "t.pftrace")
	for _, c := range []struct {
		args  []string
		shows bool // prints the function's name (not only a summary)
	}{
		{[]string{"list", "--pid", pid}, true},
		{[]string{"--pid", pid, "--enable", "ev*", "-v"}, true},
		{[]string{"stats", "--pid", pid}, true},
		{[]string{"trace", "--pid", pid, "--duration", "50ms", "--format", "text", "--max-calls", "100"}, true},
		{[]string{"top", "--pid", pid, "--count", "1", "--interval", "50ms"}, true},
		{[]string{"trace", "--pid", pid, "--duration", "50ms", "-o", pf, "--max-calls", "100"}, false},
		{[]string{"replay", pf}, true},
		{[]string{"--pid", pid, "--disable", "*", "-v"}, true},
	} {
		r := run(t, c.args...)
		out := r.Stdout + r.Stderr
		for i := 0; i < len(out); i++ {
			if b := out[i]; b < 0x20 && b != '\n' || b == 0x7f {
				t.Fatalf("hotpatch %s printed the byte %#x:\n%q", strings.Join(c.args, " "), b, out)
			}
		}
		if c.shows && !strings.Contains(out, escaped) {
			t.Errorf("hotpatch %s does not show the function as %s:\n%s", strings.Join(c.args, " "), escaped, out)
		}
	}
	if out, _ := p.Finish(); !strings.Contains(out, "done 1") {
		t.Fatalf("program output %q", out)
	}
}
