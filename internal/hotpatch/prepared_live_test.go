package hotpatch

import (
	"context"
	"errors"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// TestPreparedSelectionReadsEachTime: a session prepares a selection once,
// but every Apply of it still reads the live bytes first. Foreign bytes put
// into a site between two Applies of the same prepared selection refuse the
// next one before anything is written (the other site of the selection is
// left as it was); once the site is whole again the same selection applies.
func TestPreparedSelectionReadsEachTime(t *testing.T) {
	testutil.RequirePtrace(t)
	s := startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, "flip", true)
	ses, err := Open(s.Pid, s.probeArgs[1:], false)
	if err != nil {
		t.Fatal(err)
	}
	defer ses.Close()
	ctx := context.Background()
	sel, err := probelist.ParseSelector("work", "")
	if err != nil {
		t.Fatal(err)
	}
	on := []Action{{Enable: true, Selector: sel}}
	off := []Action{{Enable: false, Selector: sel}}
	apply := func(a []Action) (*Result, error) { return ses.Apply(ctx, a, ProtoAuto, 0) }
	for i := 0; i < 3; i++ { // prepared on the first of each
		for _, a := range [][]Action{on, off} {
			if r, err := apply(a); err != nil || !r.OK || r.Changed != 2 {
				t.Fatalf("round %d: %+v, %v", i, r, err)
			}
		}
	}
	p := ses.prepared[keyOf(t, ses, on)]
	if p == nil || len(p.sites) != 2 {
		t.Fatalf("the selection was not prepared: %+v", p)
	}
	entry, exit := p.sites[0], p.sites[1]
	if p.sel[0].probe.Kind != probelist.KindEntry {
		entry, exit = exit, entry
	}
	read := func(site xmod.Site) []byte {
		b := make([]byte, site.Len())
		if err := ses.tracer.ReadMem(site.Addr, b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	write := func(site xmod.Site, b []byte) {
		if err := ses.tracer.WriteMem(site.Addr, b); err != nil {
			t.Fatal(err)
		}
	}
	// Foreign: a nop over the entry site (neither form).
	foreign := make([]byte, entry.Len())
	for i := range foreign {
		foreign[i] = 0x90
	}
	write(entry, foreign)
	if _, err := apply(on); !errors.Is(err, ErrStale) {
		t.Fatalf("enable over a foreign site: %v, want ErrStale", err)
	}
	if got := read(exit); string(got) != string(exit.Inert) {
		t.Fatalf("the exit site was written (% x) though the request was refused", got)
	}
	// Whole again (its inert form, as before): the same prepared selection
	// applies. (An int3 left over a site is TestKilledMidPatch's: a worker reaching
	// it while only the leader is traced would die of SIGTRAP.)
	write(entry, entry.Inert)
	if r, err := apply(on); err != nil || !r.OK || r.Changed != 2 {
		t.Fatalf("enable once the site is whole: %+v, %v", r, err)
	}
	if got := read(entry); string(got) != string(entry.Active) {
		t.Fatalf("entry holds % x after the enable, want % x", got, entry.Active)
	}
	s.expectMoving(t, "work's probes on again", true, true)
	if r, err := apply(off); err != nil || !r.OK || r.Changed != 2 {
		t.Fatalf("disable: %+v, %v", r, err)
	}
	ses.Close()
	s.finish(t)
}

// keyOf finds the prepared key of actions (protocol auto) in ses.
func keyOf(t *testing.T, ses *Session, actions []Action) string {
	t.Helper()
	before := len(ses.prepared)
	p, err := ses.prepare(actions, ProtoAuto)
	if err != nil || len(ses.prepared) != before {
		t.Fatalf("prepare again: %v (cache %d -> %d)", err, before, len(ses.prepared))
	}
	for k, q := range ses.prepared {
		if q == p {
			return k
		}
	}
	t.Fatal("prepared selection not in the cache")
	return ""
}
