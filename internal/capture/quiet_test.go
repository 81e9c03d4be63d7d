package capture

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestTraceTidQuiet: a thread --tid names that recorded no event is named,
// with what it did during the capture (D81): park.c's park-c, blocked in a
// read for the whole capture, "did not run" (0 ns on a CPU); the main
// thread, which wakes every 100 µs to look for files but calls no probed
// function, ran and made no traced call; B, listed too, has its calls in
// the trace and is not named. Before, such a trace said only "0 calls"
// (what review4 saw of a thread-churning program at load 15, where the
// listed thread was runnable but not scheduled for the whole capture: its
// CPU time stood still, reproduced in a CPU-throttled cgroup).
func TestTraceTidQuiet(t *testing.T) {
	testutil.RequirePtrace(t)
	lib := testutil.Runtime(t, "gcc")
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"park.c"}, LDFlags: []string{"-rdynamic"}})
	if r := testutil.Run(t, "coldpatch", fx.Path); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	dir := t.TempDir()
	p := testutil.Start(t, []string{"LD_PRELOAD=" + lib}, fx.Path, filepath.Join(dir, "arm"), filepath.Join(dir, "release"))
	b, c := namedThread(t, p.Pid, "park-b"), namedThread(t, p.Pid, "park-c")
	pid := fmt.Sprint(p.Pid)
	r := run(t, "trace", "--pid", pid, "--enable", "work", "--tid", strconv.Itoa(b), "--tid", strconv.Itoa(c), "--tid", pid,
		"--duration", "300ms", "-o", filepath.Join(dir, "t.json"), "--json")
	var sum struct {
		Threads []ThreadDrops `json:"threads"`
		Quiet   []QuietThread `json:"quiet_tids"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &sum); err != nil {
		t.Fatalf("summary %q: %v", r.Stdout, err)
	}
	quiet := map[int]QuietThread{}
	for _, q := range sum.Quiet {
		quiet[q.Tid] = q
	}
	if q, ok := quiet[c]; !ok || q.RanNs != 0 || q.Gone || q.State != "S" {
		t.Errorf("park-c (%d): %+v; want named, 0 ns on a CPU, state S (quiet_tids %+v)", c, q, sum.Quiet)
	}
	if q, ok := quiet[p.Pid]; !ok || q.RanNs <= 0 || q.Gone {
		t.Errorf("main thread (%d): %+v; want named, some time on a CPU (quiet_tids %+v)", p.Pid, q, sum.Quiet)
	}
	if _, ok := quiet[b]; ok || len(sum.Quiet) != 2 {
		t.Errorf("quiet_tids %+v: want park-c and the main thread only, not park-b (%d)", sum.Quiet, b)
	}
	for _, want := range []string{
		fmt.Sprintf("thread %d (--tid) recorded no event: it did not run during the capture (0 ns on a CPU; state S", c),
		fmt.Sprintf("thread %d (--tid) recorded no event: it ran ", p.Pid),
	} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("stderr %q: want %q", r.Stderr, want)
		}
	}
	allOff(t, p)
	if o, _ := p.Finish(); !strings.HasPrefix(o, "done ") {
		t.Fatalf("program output %q", o)
	}
}
