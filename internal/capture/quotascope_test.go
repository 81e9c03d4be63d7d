package capture

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestQuotaProcessWide (D57): the quota is one process-wide switch, and each
// place that shows counts says so while it is on. mt.c's leaf() is enabled
// first, for counting, by someone else; then a profile and a --rate trace
// select only work(). leaf() is held to the same K per epoch meanwhile
// (millions of calls a second, at most K x epochs recorded): the profile
// and the trace name it as held (JSON quota_held, a note on stderr), and
// `stats` read during the profile warns that the counts are held, with K.
func TestQuotaProcessWide(t *testing.T) {
	const k = 20
	p := startCold(t)
	pid := fmt.Sprint(p.Pid)
	run(t, "--pid", pid, "--enable", "leaf")
	region, err := shm.OpenPID(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()

	type profRes struct {
		Functions []struct {
			Name    string `json:"name"`
			Entries uint64 `json:"entries"`
		} `json:"functions"`
		Epochs int      `json:"epochs"`
		Held   []string `json:"quota_held"`
	}
	done := make(chan testutil.Result, 1)
	go func() {
		done <- testutil.Run(t, "hotpatch", "profile", "--pid", pid, "--enable", "work", "--samples", fmt.Sprint(k),
			"--epoch", "200ms", "--duration", "1500ms", "-o", filepath.Join(t.TempDir(), "p.pprof"), "--json")
	}()
	// stats while the profile's quota is on (the capture turns it on after
	// it opened the process; it stays on until its end)
	deadline := time.Now().Add(time.Minute)
	for region.Control()&shm.CtlQuota == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the profile never turned the quota on")
		}
		time.Sleep(time.Millisecond)
	}
	st := run(t, "stats", "--pid", pid, "--json")
	var stats struct {
		Held   uint32   `json:"quota_held_by_running_capture"`
		LeftOn []string `json:"left_on_by_killed_capture"`
	}
	if err := json.Unmarshal([]byte(st.Stdout), &stats); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.Code != 0 {
		t.Fatalf("profile: exit %d: %s", r.Code, r.Stderr)
	}
	if stats.Held != k || len(stats.LeftOn) != 0 {
		t.Errorf("stats during the profile: quota_held_by_running_capture %d, left_on %q; want %d and nothing left on", stats.Held, stats.LeftOn, k)
	}
	var prof profRes
	if err := json.Unmarshal([]byte(r.Stdout), &prof); err != nil {
		t.Fatalf("%v: %q", err, r.Stdout)
	}
	if len(prof.Held) != 1 || prof.Held[0] != "leaf" || !strings.Contains(r.Stderr, "process-wide") || !strings.Contains(r.Stderr, "leaf") {
		t.Errorf("profile: quota_held %q, stderr %q; want leaf named as held", prof.Held, r.Stderr)
	}
	// at most K per epoch, plus one call per thread (mt.c's four workers)
	// whose hook read the control word before the quota went on
	const threads = 4
	for _, f := range prof.Functions {
		if f.Name == "leaf" && (f.Entries == 0 || f.Entries > k*uint64(prof.Epochs)+threads) {
			t.Errorf("leaf recorded %d calls in %d epochs of the profile; want 1..%d (held to its quota)", f.Entries, prof.Epochs, k*prof.Epochs+threads)
		}
	}
	if line := run(t, "stats", "--pid", pid).Stdout; strings.Contains(line, "warning:") {
		t.Errorf("stats after the profile still warns:\n%s", line)
	}

	tr := run(t, "trace", "--pid", pid, "--enable", "work", "--rate", "50", "--duration", "1200ms",
		"-o", filepath.Join(t.TempDir(), "t.json"), "--json")
	var trace struct {
		Held []string `json:"quota_held"`
	}
	if err := json.Unmarshal([]byte(tr.Stdout), &trace); err != nil {
		t.Fatalf("%v: %q", err, tr.Stdout)
	}
	if len(trace.Held) != 1 || trace.Held[0] != "leaf" || !strings.Contains(tr.Stderr, "process-wide") {
		t.Errorf("trace --rate: quota_held %q, stderr %q; want leaf named as held", trace.Held, tr.Stderr)
	}
	run(t, "--pid", pid, "--disable", "leaf")
	allOff(t, p)
	if out, _ := p.Finish(); !strings.Contains(out, "wrong=0") {
		t.Fatalf("program output %q", out)
	}
}
