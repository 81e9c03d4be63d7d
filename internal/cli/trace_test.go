package cli

import (
	"os"
	"path/filepath"
	"testing"
)

// TestTraceUsage: bad trace, replay and top requests fail with one line and
// the usage or failure code, and leave no output file behind.
func TestTraceUsage(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "t.pftrace")
	oneLineError(t, runHotpatch("trace", "--pid", "1", "--duration", "1s", "--format", "xml", "-o", out), ExitUsage, "hotpatch", "--format must be")
	oneLineError(t, runHotpatch("trace", "--pid", "1", "--duration", "1s", "--format", "perfetto"), ExitUsage, "hotpatch", "needs -o FILE")
	oneLineError(t, runHotpatch("trace", "--pid", "1", "-o", out), ExitUsage, "hotpatch", "positive --duration")
	oneLineError(t, runHotpatch("trace", "--pid", "1", "--duration", "1s", "--ring-events", "1000", "-o", out), ExitUsage, "hotpatch", "not a power of two")
	oneLineError(t, runHotpatch("trace", "--pid", "1", "--duration", "1s", "--ring-events", "-1", "-o", out), ExitUsage, "hotpatch", "ring-events")
	for _, bad := range [][]string{{"--tid", "0", "not a thread id"}, {"--tid", "1,2,3,4,5,6,7,8,9", "at most 8"},
		{"--max-depth", "-1", "--max-depth must be"}, {"--min-duration", "5s", "--min-duration must be"},
		{"--rate", "4294967296", "--rate must be"}, {"--max-calls", "-1", "--max-calls must be"}} {
		oneLineError(t, runHotpatch("trace", "--pid", "1", "--duration", "1s", bad[0], bad[1], "-o", out), ExitUsage, "hotpatch", bad[2])
	}
	oneLineError(t, runHotpatch("trace", "--pid", "99999999", "--duration", "1s", "-o", out), ExitGone, "hotpatch", "no such process")
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a failed trace left %d files in its directory", len(ents))
	}
	oneLineError(t, runHotpatch("top", "--pid", "1", "--interval", "0s"), ExitUsage, "hotpatch", "positive --interval")
	oneLineError(t, runHotpatch("top", "--pid", "99999999"), ExitGone, "hotpatch", "no such process")
	oneLineError(t, runHotpatch("replay"), ExitUsage, "hotpatch", "accepts 1 arg")
	js := filepath.Join(dir, "t.json")
	os.WriteFile(js, []byte(`{"traceEvents":[]}`), 0o644)
	oneLineError(t, runHotpatch("replay", js), ExitFailure, "hotpatch", "a JSON trace")
	junk := filepath.Join(dir, "junk")
	os.WriteFile(junk, []byte{0x6a, 0xff, 0x01}, 0o644)
	oneLineError(t, runHotpatch("replay", junk), ExitFailure, "hotpatch", "not a Perfetto trace")
}

func TestFormatFor(t *testing.T) {
	for out, want := range map[string]string{"": "text", "-": "text", "a.txt": "text", "a.json": "chrome-json", "a.pftrace": "perfetto", "trace": "perfetto"} {
		if got := formatFor(out); got != want {
			t.Errorf("formatFor(%q) = %s, want %s", out, got, want)
		}
	}
}
