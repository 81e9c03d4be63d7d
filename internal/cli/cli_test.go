package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

type outcome struct {
	code           int
	stdout, stderr string
}

func runColdpatch(args ...string) outcome {
	var o, e bytes.Buffer
	code := ColdpatchMain(args, &o, &e)
	return outcome{code, o.String(), e.String()}
}

func runHotpatch(args ...string) outcome {
	var o, e bytes.Buffer
	code := HotpatchMain(args, &o, &e)
	return outcome{code, o.String(), e.String()}
}

// oneLineError asserts a failure printed exactly one line, naming the command.
func oneLineError(t *testing.T, o outcome, code int, cmd, want string) {
	t.Helper()
	if o.code != code {
		t.Errorf("exit %d, want %d (stderr %q)", o.code, code, o.stderr)
	}
	if strings.Count(o.stderr, "\n") != 1 || !strings.HasPrefix(o.stderr, cmd+": ") || !strings.Contains(o.stderr, want) {
		t.Errorf("stderr %q: want one line starting %q containing %q", o.stderr, cmd+": ", want)
	}
	if o.stdout != "" {
		t.Errorf("a failure wrote to stdout: %q", o.stdout)
	}
}

func TestColdpatchCommand(t *testing.T) {
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}})
	orig, _ := os.ReadFile(fx.Path)
	out := filepath.Join(t.TempDir(), "cold")

	o := runColdpatch("-o", out, "--summary", fx.Path)
	if o.code != ExitOK {
		t.Fatalf("exit %d: %s", o.code, o.stderr)
	}
	l, err := probelist.Read(strings.NewReader(o.stdout))
	if err != nil {
		t.Fatalf("stdout is not a probe list: %v", err)
	}
	if l.Binary.Path != out {
		t.Errorf("list names %s, want the output %s", l.Binary.Path, out)
	}
	for _, want := range []string{"sites", "call_rel32", "straddling a cache line", "patched now"} {
		if !strings.Contains(o.stderr, want) {
			t.Errorf("--summary lacks %q:\n%s", want, o.stderr)
		}
	}
	if now, _ := os.ReadFile(fx.Path); !bytes.Equal(now, orig) {
		t.Error("-o modified the input")
	}

	// Again on the cold output: the same list, quietly.
	o2 := runColdpatch(out)
	if o2.code != ExitOK || o2.stderr != "" {
		t.Fatalf("second run: exit %d, stderr %q", o2.code, o2.stderr)
	}
	if o2.stdout != o.stdout {
		t.Error("second run printed a different probe list")
	}

	dry := runColdpatch("--dry-run", fx.Path)
	if dry.code != ExitOK {
		t.Fatalf("--dry-run: exit %d: %s", dry.code, dry.stderr)
	}
	if now, _ := os.ReadFile(fx.Path); !bytes.Equal(now, orig) {
		t.Error("--dry-run modified the input")
	}
}

func TestColdpatchErrors(t *testing.T) {
	notELF := filepath.Join(t.TempDir(), "script")
	os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755)
	oneLineError(t, runColdpatch(), ExitUsage, "coldpatch", "exactly one BINARY")
	oneLineError(t, runColdpatch("a", "b"), ExitUsage, "coldpatch", "exactly one BINARY")
	oneLineError(t, runColdpatch("--bogus", "x"), ExitUsage, "coldpatch", "unknown flag")
	oneLineError(t, runColdpatch("--placeholder", "int3", notELF), ExitUsage, "coldpatch", "flip or nop")
	oneLineError(t, runColdpatch(notELF), ExitFailure, "coldpatch", "not an ELF file")
	oneLineError(t, runColdpatch(filepath.Join(t.TempDir(), "missing")), ExitFailure, "coldpatch", "no such file")
}

func TestColdpatchHelpAndCompletion(t *testing.T) {
	o := runColdpatch("--help")
	if o.code != ExitOK || !strings.Contains(o.stdout, "Examples:") || !strings.Contains(o.stdout, "coldpatch ./app > probes.json") {
		t.Errorf("--help: exit %d, output lacks examples:\n%s", o.code, o.stdout)
	}
	c := runColdpatch("--completion", "bash")
	if c.code != ExitOK || !strings.Contains(c.stdout, "__start_coldpatch") {
		t.Errorf("--completion bash: exit %d, %q", c.code, c.stderr)
	}
}

func TestHotpatchUsage(t *testing.T) {
	oneLineError(t, runHotpatch("--enable", "f"), ExitUsage, "hotpatch", "--pid is required")
	oneLineError(t, runHotpatch("--pid", "1"), ExitUsage, "hotpatch", "nothing to do")
	oneLineError(t, runHotpatch("--pid", "1", "--enable", "f", "--protocol", "magic"), ExitUsage, "hotpatch", "--protocol")
	oneLineError(t, runHotpatch("--pid", "1", "--enable", "id:x"), ExitUsage, "hotpatch", "id must be")
	oneLineError(t, runHotpatch("--pid", "1", "--enable", "f", "--kind", "middle"), ExitUsage, "hotpatch", "kind")
	oneLineError(t, runHotpatch("list"), ExitUsage, "hotpatch", "--pid is required")
	oneLineError(t, runHotpatch("frobnicate"), ExitUsage, "hotpatch", "unknown command")
}

func TestHotpatchNoProcess(t *testing.T) {
	// A pid above pid_max cannot exist.
	oneLineError(t, runHotpatch("--pid", "99999999", "--enable", "f"), ExitGone, "hotpatch", "no such process")
	oneLineError(t, runHotpatch("list", "--pid", "99999999"), ExitGone, "hotpatch", "no such process")
	oneLineError(t, runHotpatch("repair", "--pid", "99999999"), ExitGone, "hotpatch", "no such process")
	oneLineError(t, runHotpatch("repair"), ExitUsage, "hotpatch", "--pid is required")
}

func TestHotpatchHelp(t *testing.T) {
	o := runHotpatch("--help")
	for _, want := range []string{"Examples:", "hotpatch --pid 4242 --enable handle_request", "Exit status", "list"} {
		if !strings.Contains(o.stdout, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
	c := runHotpatch("completion", "bash")
	if c.code != ExitOK || !strings.Contains(c.stdout, "__start_hotpatch") {
		t.Errorf("completion bash: exit %d, %q", c.code, c.stderr)
	}
}

// TestColdpatchFentry: the summary counts sites by provider and the
// __mcount_loc cross-check, and a disagreeing table is warned about.
func TestColdpatchFentry(t *testing.T) {
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}, NoInstr: true, Profile: testutil.ProfileFentry, Flags: []string{"-mrecord-mcount"}})
	o := runColdpatch("--dry-run", "--summary", fx.Path)
	if o.code != ExitOK {
		t.Fatalf("exit %d: %s", o.code, o.stderr)
	}
	for _, want := range []string{"provider fentry", "__mcount_loc", "0 not sites, 0 sites unlisted"} {
		if !strings.Contains(o.stderr, want) {
			t.Errorf("--summary lacks %q:\n%s", want, o.stderr)
		}
	}
	if strings.Contains(o.stderr, "warning") {
		t.Errorf("warnings for a consistent build:\n%s", o.stderr)
	}
	refs := testutil.Build(t, testutil.Spec{Sources: []string{"fentry_refs.S"}, PIE: testutil.Bool(false), Static: true, NoInstr: true, Flags: []string{"-nostdlib"}})
	o = runColdpatch("--dry-run", refs.Path)
	for _, want := range []string{"__mcount_loc lists 0x", "is not listed in __mcount_loc", "call to mcount"} {
		if o.code != ExitOK || !strings.Contains(o.stderr, want) {
			t.Errorf("exit %d, stderr lacks %q:\n%s", o.code, want, o.stderr)
		}
	}
	if q := runColdpatch("--dry-run", "--quiet", refs.Path); q.stderr != "" {
		t.Errorf("--quiet printed %q", q.stderr)
	}
}
