package xmod_test

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/ptrace"
)

var forkLine = regexp.MustCompile(`forks=(\d+) childdied=(\d+) childbad=(\d+) lastsig=(\d+)`)

// runStressFork toggles every site at full speed while the target forks and
// vforks children that run the sites (issue 11: children inherited the int3
// of a batch in flight and, having no tracer, died of SIGTRAP). The
// fixture's verdict counts every child killed by a signal or exiting with a
// wrong checksum; the test wants none, and at least a few forks while the
// batches ran.
func runStressFork(t *testing.T, p protocol) { runStressForkMode(t, p, "fork", 10) }

// runStressForkMode runs the fork stress in the fixture's mode, wanting at
// least minForks children.
func runStressForkMode(t *testing.T, p protocol, mode string, minForks int) {
	st := startStressMode(t, buildStress(t, true), 2, mode)
	sites := st.sites(t, p.flip)
	var tr *ptrace.Tracer
	if p.traced {
		tr = attach(t, st.pid)
	}
	ctx := context.Background()
	deadline := time.Now().Add(soak(t))
	toggles := 0
	for time.Now().Before(deadline) {
		for _, on := range []bool{false, true} {
			var err error
			if tr != nil {
				err = p.toggle(ctx, tr, tr, changes(sites, on))
			} else {
				err = p.toggle(ctx, nil, st.mem, changes(sites, on))
			}
			if err != nil {
				t.Fatalf("%s: batch on=%v after %d toggles: %v (stderr %s)", p.name, on, toggles, err, st.stderr)
			}
			toggles += len(sites)
		}
	}
	var stats ptrace.Stats
	if tr != nil {
		requireValid(t, tr, sites)
		stats = tr.Stats()
		if mode == "vforkhold" && stats.Vforks == 0 {
			t.Fatalf("%s: the vfork child alive at attach was not traced: %+v", p.name, stats)
		}
		if mode == "vfork2hold" && stats.Vforks < 2 {
			t.Fatalf("%s: the vfork child and grandchild alive at attach were not both traced: %+v", p.name, stats)
		}
		if err := tr.Detach(); err != nil {
			t.Fatal(err)
		}
	} else {
		requireValid(t, st.mem, sites)
	}
	line := st.finish(t) // fails unless childdied=0 and childbad=0
	mm := forkLine.FindStringSubmatch(line)
	if mm == nil {
		t.Fatalf("done line without fork counts: %s", line)
	}
	if n, _ := strconv.Atoi(mm[1]); n < minForks {
		t.Fatalf("only %d forks while batches ran: the test proves nothing (%s)", n, line)
	}
	t.Logf("%s: %d site toggles; tracer %+v; fixture: %s", p.name, toggles, stats, line)
}

func TestForkFlip(t *testing.T)      { runStressFork(t, protoFlip) }
func TestForkInt3(t *testing.T)      { runStressFork(t, protoInt3) }
func TestForkInt3Async(t *testing.T) { runStressFork(t, protoInt3Async) }
func TestForkStop(t *testing.T)      { runStressFork(t, protoStop) }

// The fixture's vforkhold mode has a vfork child running the sites before
// we attach, its parent thread blocked in vfork: seizing the threads does
// not trace it (it is no thread of the target, and its parent was not
// traced when it vforked), so before seizeVforkChildren it died of the
// first int3 of the first batch (the 3% of TestForkInt3* failures with
// lastvfork=1: a vfork child alive at attach). The traced protocols must
// find it (Stats.Vforks) and hold it like a thread.
func TestForkVforkAtAttach(t *testing.T) {
	for _, p := range []protocol{protoFlip, protoInt3, protoInt3Async, protoStop} {
		t.Run(p.name, func(t *testing.T) { runStressForkMode(t, p, "vforkhold", 1) })
	}
}

// The same one generation down (vfork2hold): the vfork child vforked in
// turn before we attached, and the grandchild runs the sites while the
// child sits blocked in vfork. The grandchild's parent is the child, not
// the target, and the child is no thread of the target: both must be
// found and traced (the grandchild would die of the first int3; the child,
// left unmarked, would keep StopAll waiting until the grandchild exits).
func TestForkVfork2AtAttach(t *testing.T) {
	for _, p := range []protocol{protoFlip, protoInt3, protoInt3Async, protoStop} {
		t.Run(p.name, func(t *testing.T) { runStressForkMode(t, p, "vfork2hold", 1) })
	}
}
