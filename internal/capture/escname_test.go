package capture

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	// Each command runs until its output shows the function (the program
	// may not have run between a probe going on and a look at its counts,
	// on a loaded machine), a minute at most; every output is checked.
	for _, c := range []struct {
		args  []string
		shows bool // prints the function's name (not only a summary)
	}{
		{[]string{"list", "--pid", pid}, true},
		{[]string{"--pid", pid, "--enable", "ev*", "-v"}, true},
		{[]string{"trace", "--pid", pid, "--duration", "1s", "--format", "text", "--max-calls", "100"}, true},
		{[]string{"trace", "--pid", pid, "--duration", "1s", "-o", pf, "--max-calls", "100"}, false},
		{[]string{"replay", pf}, true},
		{[]string{"stats", "--pid", pid}, true},
		{[]string{"top", "--pid", pid, "--count", "1", "--interval", "200ms"}, true},
		{[]string{"--pid", pid, "--disable", "*", "-v"}, true},
	} {
		for deadline := time.Now().Add(time.Minute); ; {
			r := run(t, c.args...)
			out := r.Stdout + r.Stderr
			for i := 0; i < len(out); i++ {
				if b := out[i]; b < 0x20 && b != '\n' || b == 0x7f {
					t.Fatalf("hotpatch %s printed the byte %#x:\n%q", strings.Join(c.args, " "), b, out)
				}
			}
			if !c.shows || strings.Contains(out, escaped) {
				break
			}
			if c.args[0] == "replay" || c.args[1] == pid || time.Now().After(deadline) {
				t.Fatalf("hotpatch %s does not show the function as %s:\n%s", strings.Join(c.args, " "), escaped, out)
			}
		}
	}
	if out, _ := p.Finish(); !strings.Contains(out, "done 1") {
		t.Fatalf("program output %q", out)
	}
}
