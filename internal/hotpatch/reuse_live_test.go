package hotpatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// reuseSubject is a running gcc -O2 mt.c under a Session, with work's
// enable and disable and its two sites (entry first).
type reuseSubject struct {
	s           *subject
	ses         *Session
	on, off     []Action
	entry, exit xmod.Site
}

func startReuse(t *testing.T) *reuseSubject {
	t.Helper()
	testutil.RequirePtrace(t)
	s := startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "flip", true)
	ses, err := Open(s.Pid, s.probeArgs[1:], false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ses.Close() })
	sel, err := probelist.ParseSelector("work", "")
	if err != nil {
		t.Fatal(err)
	}
	r := &reuseSubject{s: s, ses: ses, on: []Action{{Enable: true, Selector: sel}}, off: []Action{{Enable: false, Selector: sel}}}
	p, err := ses.prepare(r.on, ProtoAuto)
	if err != nil || len(p.sites) != 2 {
		t.Fatalf("prepare work: %v, %+v", err, p)
	}
	r.entry, r.exit = p.sites[0], p.sites[1]
	if p.sel[0].probe.Kind != probelist.KindEntry {
		r.entry, r.exit = r.exit, r.entry
	}
	return r
}

func (r *reuseSubject) apply(a []Action) (*Result, error) {
	return r.ses.Apply(context.Background(), a, ProtoAuto, 0)
}

func (r *reuseSubject) read(t *testing.T, site xmod.Site) []byte {
	t.Helper()
	b := make([]byte, site.Len())
	if err := r.ses.tracer.ReadMem(site.Addr, b); err != nil {
		t.Fatal(err)
	}
	return b
}

// write stores b at site as a writer inside the target would (another
// descriptor of the process's memory: the session does not see it).
// Inside a Batch (the tracer's thread) it must not end the goroutine: it
// returns the error.
func (r *reuseSubject) write(site xmod.Site, b []byte) error {
	return r.ses.tracer.WriteMem(site.Addr, b)
}

// mustWrite is write outside a Batch.
func (r *reuseSubject) mustWrite(t *testing.T, site xmod.Site, b []byte) {
	t.Helper()
	if err := r.write(site, b); err != nil {
		t.Fatal(err)
	}
}

func nops(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = 0x90
	}
	return b
}

// TestSessionReusesReadInBatch: inside one Batch, a command on the sites
// the previous command just read after its write (every site as asked)
// writes from that read instead of reading again (D64); the first command
// of a Batch, and a command after a failed one, read. Every command still
// ends with its own read after, so each result is checked, and the
// target's probes behave as the results say.
func TestSessionReusesReadInBatch(t *testing.T) {
	r := startReuse(t)
	r.ses.reuseWithin = time.Hour // the count below must not depend on the machine's load
	const n = 200
	err := r.ses.Batch(func() error {
		for i := 0; i < n; i++ {
			a := r.on
			if i%2 == 1 {
				a = r.off
			}
			if res, err := r.apply(a); err != nil || !res.OK || res.Changed != 2 {
				return fmt.Errorf("command %d: %+v, %v", i, res, err)
			}
		}
		// The same command again: the reused read says both sites are
		// already as asked, so nothing is written.
		if res, err := r.apply(r.off); err != nil || !res.OK || res.Changed != 0 || res.Unchanged != 2 {
			return fmt.Errorf("disable again: %+v, %v", res, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.ses.reused != n {
		t.Fatalf("%d commands wrote from the previous read, want %d (all but the first)", r.ses.reused, n)
	}
	if got := r.read(t, r.entry); string(got) != string(r.entry.Inert) {
		t.Fatalf("entry % x after the batch, want inert % x", got, r.entry.Inert)
	}
	r.s.expectFrozen(t, "work's probes off") // a worker descheduled inside a hook may finish it late (expectFrozen allows one count per worker in its first window)
	// A new Batch reads: the last read of the previous one is not used.
	if err := r.ses.Batch(func() error {
		res, err := r.apply(r.on)
		if err != nil || !res.OK || res.Changed != 2 {
			return fmt.Errorf("enable in a new batch: %+v, %v", res, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if r.ses.reused != n {
		t.Fatalf("the first command of a new Batch reused a read (%d)", r.ses.reused)
	}
	r.s.expectMoving(t, "work's probes on", true, true)
	if res, err := r.apply(r.off); err != nil || !res.OK {
		t.Fatalf("disable outside a batch: %+v, %v", res, err)
	}
	if r.ses.reused != n {
		t.Fatalf("a command outside Batch reused a read (%d)", r.ses.reused)
	}
	r.ses.Close()
	r.s.finish(t)
}

// TestSessionReuseHostile: a writer in the target puts foreign bytes into
// a site between two commands of one Batch.
//   - Outside ReuseWithin (the usual case for anything slower than our own
//     Go work) the next command reads again and is refused before anything
//     is written: the other site keeps its bytes, the foreign bytes stay.
//   - After a new Batch the same: reads are never carried across Batches.
//   - Inside the window (forced here with a long one) the store falls in the
//     time the reused read gives up, like a store between a read and its
//     write in any command: the command writes its one byte per site, its
//     own read after finds the site foreign and its result fails, and the
//     next command, which never reuses a failed command's read, refuses
//     before writing. No command reports success over a foreign site.
func TestSessionReuseHostile(t *testing.T) {
	r := startReuse(t)
	foreign := nops(r.entry.Len())
	batch := func(fn func() error) {
		t.Helper()
		if err := r.ses.Batch(fn); err != nil {
			t.Fatal(err)
		}
	}
	// Outside the window.
	batch(func() error {
		if res, err := r.apply(r.on); err != nil || !res.OK || res.Changed != 2 {
			return fmt.Errorf("enable: %+v, %v", res, err)
		}
		if err := r.write(r.entry, foreign); err != nil {
			return err
		}
		// Time passing is the point here, not a synchronisation: a read
		// older than ReuseWithin is not used.
		time.Sleep(2 * ReuseWithin)
		if _, err := r.apply(r.off); !errors.Is(err, ErrStale) {
			return fmt.Errorf("disable over a foreign site after %v: %v, want ErrStale", 2*ReuseWithin, err)
		}
		return nil
	})
	if got := r.read(t, r.exit); string(got) != string(r.exit.Active) {
		t.Fatalf("the exit site was written (% x) though the request was refused", got)
	}
	if got := r.read(t, r.entry); string(got) != string(foreign) {
		t.Fatalf("the foreign site was written: % x", got)
	}
	// Across Batches, even with a window that would allow it.
	r.mustWrite(t, r.entry, r.entry.Active)
	r.ses.reuseWithin = time.Hour
	batch(func() error {
		if res, err := r.apply(r.off); err != nil || !res.OK || res.Changed != 2 {
			return fmt.Errorf("disable: %+v, %v", res, err)
		}
		return nil
	})
	r.mustWrite(t, r.entry, foreign)
	batch(func() error {
		if _, err := r.apply(r.on); !errors.Is(err, ErrStale) {
			return fmt.Errorf("enable over a foreign site in a new batch: %v, want ErrStale", err)
		}
		return nil
	})
	if got := r.read(t, r.exit); string(got) != string(r.exit.Inert) {
		t.Fatalf("the exit site was written (% x) though the request was refused", got)
	}
	// Inside the window.
	r.mustWrite(t, r.entry, r.entry.Inert)
	batch(func() error {
		if res, err := r.apply(r.on); err != nil || !res.OK || res.Changed != 2 {
			return fmt.Errorf("enable: %+v, %v", res, err)
		}
		if err := r.write(r.entry, foreign); err != nil {
			return err
		}
		res, err := r.apply(r.off)
		if err != nil || res == nil || res.OK {
			return fmt.Errorf("disable over a site made foreign after the reused read: %+v, %v: want a result that is not OK", res, err)
		}
		if entry := siteAfter(res, r.entry); entry != "foreign" {
			return fmt.Errorf("its result says the entry site is %q, want foreign", entry)
		}
		if r.ses.reused != 1 {
			return fmt.Errorf("reused %d reads, want 1", r.ses.reused)
		}
		if _, err := r.apply(r.on); !errors.Is(err, ErrStale) {
			return fmt.Errorf("the command after the failed one: %v, want ErrStale (a fresh read)", err)
		}
		return nil
	})
	if r.ses.reused != 1 {
		t.Fatalf("a failed command's read was reused (%d)", r.ses.reused)
	}
	if got := r.read(t, r.exit); string(got) != string(r.exit.Inert) {
		t.Fatalf("exit % x after the refused enable, want inert % x", got, r.exit.Inert)
	}
	// Whole again: the session goes on.
	r.mustWrite(t, r.entry, r.entry.Inert)
	if res, err := r.apply(r.on); err != nil || !res.OK || res.Changed != 2 {
		t.Fatalf("enable once whole: %+v, %v", res, err)
	}
	r.s.expectMoving(t, "work's probes on", true, true)
	if res, err := r.apply(r.off); err != nil || !res.OK {
		t.Fatalf("disable: %+v, %v", res, err)
	}
	r.ses.Close()
	r.s.finish(t)
}

// siteAfter is the After of site in res.
func siteAfter(res *Result, site xmod.Site) string {
	for _, s := range res.Sites {
		if s.Address == "0x"+strconv.FormatUint(site.Addr, 16) {
			return s.After
		}
	}
	return "missing"
}

// TestSessionConcurrentWriter: a script streams toggles of main's entry
// probe (a site no thread runs again once main has started, so whatever
// lands in it cannot hurt the program) while another process stores
// foreign bytes (nops) over that site at an arbitrary moment of the
// stream. Wherever the store lands (between two commands: the window a
// reused read gives up, D64; between a command's write and its read
// after; between a read and its write), the results before it succeeded,
// the first command whose read after sees it fails (not OK, the site
// named foreign), at most one failing command wrote at all, and every
// later command is refused before writing. The site ends as the foreign
// bytes, or with our one differing byte in them (a write that landed
// after the store), nothing else.
func TestSessionConcurrentWriter(t *testing.T) {
	testutil.RequirePtrace(t)
	s := startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "flip", true)
	sel, err := probelist.ParseSelector("main", probelist.KindEntry)
	if err != nil {
		t.Fatal(err)
	}
	ses, err := Open(s.Pid, s.probeArgs[1:], false)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ses.prepare([]Action{{Enable: true, Selector: sel}}, ProtoAuto)
	if err != nil || len(p.sites) != 1 {
		ses.Close()
		t.Fatalf("main's entry probe: %v, %+v", err, p)
	}
	site := p.sites[0]
	d := site.Differing()
	ses.Close()
	if len(d) != 1 {
		t.Fatalf("main's entry site differs in %d bytes, want a flip site", len(d))
	}
	mem, err := ptrace.OpenMem(s.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	foreign := nops(site.Len())

	ss := startSession(t, s)
	const n = 20000
	go func() {
		var script strings.Builder
		for i := 0; i < n/2; i++ {
			script.WriteString("enable main --kind entry\ndisable main --kind entry\n")
		}
		io.WriteString(ss.in, script.String())
		ss.in.Close()
	}()
	// The store goes in while the session works through the stream: after
	// a result somewhere in its first half (the session runs ahead of the
	// results read here by a pipe's worth of commands or more).
	at := 1 + int(time.Now().UnixNano()%int64(n/2))
	firstBad, wroteAfter := 0, 0
	for i := 1; i <= n; i++ {
		l := ss.read(t)
		if l.Line != i {
			t.Fatalf("result %d: %+v", i, l)
		}
		if i == at {
			if err := mem.WriteMem(site.Addr, foreign); err != nil {
				testutil.Unavailable(t, "writing the target's text from a process that does not trace it: %v", err)
			}
		}
		switch {
		case l.OK && firstBad == 0:
			if l.Changed != 1 {
				t.Fatalf("result %d: %+v, want one site changed", i, l)
			}
		case l.OK:
			t.Fatalf("result %d succeeded after result %d failed: %+v", i, firstBad, l)
		default:
			if firstBad == 0 {
				firstBad = i
			}
			if l.Changed > 0 {
				wroteAfter++
			}
			if !strings.Contains(l.Error, "neither its active nor its inert bytes") && !strings.Contains(l.Error, "foreign") {
				t.Fatalf("result %d: %+v, want the site named foreign", i, l)
			}
		}
	}
	ss.wait(t)
	if firstBad == 0 || firstBad < at {
		t.Fatalf("first failed result %d, store after result %d", firstBad, at)
	}
	if wroteAfter > 1 {
		t.Fatalf("%d failed commands wrote to the site, want at most 1 (the first)", wroteAfter)
	}
	got := make([]byte, site.Len())
	if err := mem.ReadMem(site.Addr, got); err != nil {
		t.Fatal(err)
	}
	clean := string(got) == string(foreign)
	ok := clean
	for _, b := range []byte{site.Active[d[0]], site.Inert[d[0]]} {
		mixed := append([]byte(nil), foreign...)
		mixed[d[0]] = b
		ok = ok || (wroteAfter == 1 && string(got) == string(mixed))
	}
	if !ok {
		t.Fatalf("main's entry site holds % x: want the foreign % x, or it with our one byte (%d failed commands wrote)", got, foreign, wroteAfter)
	}
	t.Logf("store after result %d; first failure at %d, which wrote %v; the site holds %s", at, firstBad, wroteAfter == 1,
		map[bool]string{true: "the foreign bytes", false: "the foreign bytes with our one byte"}[clean])
	s.finish(t) // wrong=0: the workers never computed a wrong value
}
