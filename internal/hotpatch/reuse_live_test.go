package hotpatch

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
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
	r.s.expectMoving(t, "work's probes off", false, false)
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
