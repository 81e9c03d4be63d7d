package hotpatch

import (
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestSessionHostileInput: a hand-edited or generated script's worst lines
// (one of 2 MiB, NUL bytes, a glob matching nothing beside a name that
// matches, a name given twice, the same probe enabled and disabled on
// consecutive lines) each get their own result and the session goes on:
// the commands after them are run, nothing is written for a refused
// command, and the session ends with exit 0.
func TestSessionHostileInput(t *testing.T) {
	testutil.RequirePtrace(t)
	s := startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "flip", true)
	s.expectFrozen(t, "cold at start")
	ss := startSession(t, s)
	ss.send(t,
		"enable leaf --kind entry",           // 1
		"enable "+strings.Repeat("w", 2<<20), // 2: longer than a line may be
		"enable wo\x00rk",                    // 3
		"\x00",                               // 4
		"enable nosuch* work",                // 5: all or nothing: work is not enabled
		"enable work work --kind entry",      // 6: work's entry once
		"disable work",                       // 7
		"enable work --kind exit",            // 8
		"disable leaf work",                  // 9
		"stats")                              // 10
	want := []struct {
		ok        bool
		exit      int
		err       string
		changed   int
		unchanged int
	}{
		{true, 0, "", 1, 0},
		{false, 2, "line longer than", 0, 0},
		{false, 3, "no probe matched", 0, 0},
		{false, 2, "unknown command", 0, 0},
		{false, 3, "no probe matched \"nosuch*\"", 0, 0},
		{true, 0, "", 1, 0},
		{true, 0, "", 1, 1},
		{true, 0, "", 1, 0},
		{true, 0, "", 2, 2},
		{true, 0, "", 0, 0},
	}
	for i, w := range want {
		l := ss.read(t)
		if l.Line != i+1 || l.OK != w.ok || l.Exit != w.exit || !strings.Contains(l.Error, w.err) || l.Changed != w.changed || l.Unchanged != w.unchanged {
			t.Fatalf("line %d: got %+v, want ok=%v exit=%d error ~%q changed %d unchanged %d", i+1, l, w.ok, w.exit, w.err, w.changed, w.unchanged)
		}
		if l.Line == 10 && (l.Commands == nil || *l.Commands != 10 || *l.Toggles != 6 || *l.Errors != 4) {
			t.Fatalf("stats: commands %v toggles %v errors %v, want 10, 6, 4", *l.Commands, *l.Toggles, *l.Errors)
		}
	}
	ss.in.Close()
	ss.wait(t)
	s.expectFrozen(t, "every probe off after the session")
	s.finish(t)
}
