package capture

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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
	// The looks that show what the program did wait on its progress, not on
	// time: a trace ends at --max-calls (its duration is only a bound), and
	// stats runs once the program has called evil since its probes went on.
	progress := p.Symbol(p.Cmd.Path, "progress")
	for _, c := range []struct {
		args  []string
		shows bool // prints the function's name (not only a summary)
		after bool // wait for calls of evil first
	}{
		{[]string{"list", "--pid", pid}, true, false},
		{[]string{"--pid", pid, "--enable", "ev*", "-v"}, true, false},
		{[]string{"trace", "--pid", pid, "--duration", "1m", "--format", "text", "--max-calls", "100"}, true, false},
		{[]string{"trace", "--pid", pid, "--duration", "1m", "-o", pf, "--max-calls", "100"}, false, false},
		{[]string{"replay", pf}, true, false},
		{[]string{"stats", "--pid", pid}, true, true},
		{[]string{"--pid", pid, "--disable", "*", "-v"}, true, false},
	} {
		if c.after {
			p.AwaitProgress(progress, 1000)
		}
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
	// top shows a function in an interval that had calls of it: it runs
	// until one has (the program's progress decides, not a window), every
	// line checked, then is interrupted.
	run(t, "--pid", pid, "--enable", "ev*")
	top := exec.Command(testutil.Command(t, "hotpatch"), "top", "--pid", pid, "--interval", "100ms")
	tout, err := top.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := testutil.StartBound(top); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(tout)
	seen := false
	for !seen && sc.Scan() {
		line := sc.Text()
		for i := 0; i < len(line); i++ {
			if b := line[i]; b < 0x20 || b == 0x7f {
				top.Process.Kill()
				top.Wait()
				t.Fatalf("hotpatch top printed the byte %#x: %q", b, line)
			}
		}
		seen = strings.Contains(line, escaped)
	}
	top.Process.Signal(syscall.SIGINT)
	go io.Copy(io.Discard, tout)
	if err := top.Wait(); err != nil || !seen {
		t.Fatalf("hotpatch top: %v, showed the function: %v", err, seen)
	}
	run(t, "--pid", pid, "--disable", "*")
	if out, _ := p.Finish(); !strings.Contains(out, "done 1") {
		t.Fatalf("program output %q", out)
	}
}
