package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
	"github.com/edgeprobe/edgeprobe/internal/report"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestReplayInput: `hotpatch replay FILE` as root where FILE is in a
// sticky world-writable directory (/tmp). Another user's FIFO there (no
// writer), a device and another user's link (to a trace of root's) end in
// one line at once; another user's regular trace file, root's own FIFO
// (fed by a writer) and root's own file replay. Before (D100) it opened
// with os.Open: the FIFO held it in the open forever (and a device had its
// open called; /dev/zero's bytes were then refused by the parser). Each run
// is bounded (10 s) so that a hang fails the test.
func TestReplayInput(t *testing.T) {
	other := testutil.OtherUser(t)
	var pf bytes.Buffer
	ps, err := report.NewPerfettoSink(&pf, 5, "app", nil)
	if err != nil {
		t.Fatal(err)
	}
	m := calltrace.NewMatcher(ps)
	work := &calltrace.Function{Addr: 1, Name: "work", Object: "/bin/app"}
	for _, e := range []*calltrace.Event{{Kind: calltrace.Entry, Thread: 42, TimeNs: 1000, Func: work}, {Kind: calltrace.Exit, Thread: 42, TimeNs: 3000, Func: work}} {
		if err := m.Add(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	trace := pf.Bytes()
	dir := testutil.StickyDir(t, "edgeprobe-replay-")
	rootsTrace := filepath.Join(t.TempDir(), "root.pftrace")
	if err := os.WriteFile(rootsTrace, trace, 0o600); err != nil {
		t.Fatal(err)
	}
	theirFIFO, theirLink, theirFile := filepath.Join(dir, "fifo"), filepath.Join(dir, "link"), filepath.Join(dir, "theirs.pftrace")
	other.Run(t, "mkfifo", theirFIFO)
	other.Run(t, "ln", "-s", rootsTrace, theirLink)
	other.Run(t, "cp", "/dev/null", theirFile)
	if err := os.WriteFile(theirFile, trace, 0); err != nil { // root writes their file's bytes; it stays theirs
		t.Fatal(err)
	}
	ownFIFO := filepath.Join(dir, "own.fifo")
	if err := syscall.Mkfifo(ownFIFO, 0o600); err != nil {
		t.Fatal(err)
	}
	replay := func(path string) outcome {
		t.Helper()
		done := make(chan outcome, 1)
		go func() { done <- runHotpatch("replay", path) }()
		select {
		case o := <-done:
			return o
		case <-time.After(10 * time.Second):
			t.Fatalf("replay %s: still running after 10 s (in the open or reading without end)", path)
			return outcome{}
		}
	}
	oneLineError(t, replay(theirFIFO), ExitFailure, "hotpatch", "a FIFO owned by another user")
	oneLineError(t, replay("/dev/zero"), ExitFailure, "hotpatch", "not a regular file")
	oneLineError(t, replay(theirLink), ExitFailure, "hotpatch", "symbolic link owned by another user")
	go func() { // the writer of root's own FIFO
		if f, err := os.OpenFile(ownFIFO, os.O_WRONLY, 0); err == nil {
			f.Write(trace)
			f.Close()
		}
	}()
	for _, p := range []string{theirFile, ownFIFO, rootsTrace} {
		o := replay(p)
		if o.code != 0 || !strings.Contains(o.stdout, "work()") {
			t.Errorf("replay %s: exit %d, stdout %q, stderr %q; want work's call", p, o.code, o.stdout, o.stderr)
		}
	}
}
