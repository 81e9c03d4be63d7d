package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procmaps"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// Sites returns the run-time sites of the probes of function fn ("" for all)
// and kind ("" for both) in the main executable of pid.
func Sites(pid int, l *probelist.List, fn, kind string) ([]xmod.Site, error) {
	obj, err := procmaps.Main(pid)
	if err != nil {
		return nil, err
	}
	if l.Binary.BuildID != "" && obj.BuildID != l.Binary.BuildID {
		return nil, fmt.Errorf("pid %d runs build-id %s, the probe list is for %s", pid, obj.BuildID, l.Binary.BuildID)
	}
	var out []xmod.Site
	for _, p := range l.Probes {
		if (fn != "" && p.Function != fn) || (kind != "" && p.Kind != kind) {
			continue
		}
		out = append(out, xmod.Site{Addr: obj.Runtime(uint64(p.Address)), Active: p.Active, Inert: p.Inert,
			Name: fmt.Sprintf("%s/%s", p.Function, p.Kind)})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no %q probe of %q in the probe list", kind, fn)
	}
	return out, nil
}

// probeOf returns the probe list entry of fn's kind probe.
func probeOf(l *probelist.List, fn, kind string) (probelist.Probe, error) {
	for _, p := range l.Probes {
		if p.Function == fn && p.Kind == kind {
			return p, nil
		}
	}
	return probelist.Probe{}, fmt.Errorf("no %s probe of %s", kind, fn)
}

func changes(sites []xmod.Site, on bool) []xmod.Change {
	cs := make([]xmod.Change, len(sites))
	for i, s := range sites {
		cs[i] = xmod.Change{Site: s, On: on}
	}
	return cs
}

// flipper returns a switch that turns sites on or off with the flip
// protocol through mem.
func flipper(ctx context.Context, mem xmod.Mem, sites []xmod.Site) func(on bool) error {
	on, off := changes(sites, true), changes(sites, false)
	return func(v bool) error {
		cs := off
		if v {
			cs = on
		}
		_, err := xmod.Flip(ctx, mem, cs, xmod.FlipOptions{})
		return err
	}
}

// checkLive verifies a toggle target's probes work: with probes on, the hook
// counts grow; with them off, they stay put. set switches them. Each half
// waits until the executors have made liveCalls calls (they are pinned to
// one core that other load may hold for a while), so neither half passes
// for want of calls, and the target is known to have run its hooks.
//
// A call that entered its hook before the disable returned may count after
// it (its thread preempted inside the hook): the disabled half starts from
// counts taken once the executors have made calls since the disable, which
// a thread only makes after its hook returned. The harness's targets run
// one executor thread, for which that is a proof (toggle.c and many_main.c
// add to their call count only after calls returned).
func checkLive(ctx context.Context, t *Target, set func(on bool) error) error {
	if err := set(true); err != nil {
		return err
	}
	a, err := t.Counts(ctx)
	if err != nil {
		return err
	}
	b, err := awaitCalls(ctx, t, a, liveCalls)
	if err != nil {
		return fmt.Errorf("probes enabled: %w", err)
	}
	if b.Enters == a.Enters { // some rows enable the entry probe alone
		return fmt.Errorf("probes enabled but no hook ran: %+v then %+v", a, b)
	}
	if err := set(false); err != nil {
		return err
	}
	off, err := t.Counts(ctx)
	if err != nil {
		return err
	}
	c, err := awaitCalls(ctx, t, off, liveCalls) // a hook begun before the disable has returned
	if err != nil {
		return fmt.Errorf("probes disabled: %w", err)
	}
	d, err := awaitCalls(ctx, t, c, liveCalls)
	if err != nil {
		return fmt.Errorf("probes disabled: %w", err)
	}
	if d.Enters != c.Enters {
		return fmt.Errorf("probes disabled but hooks still ran: %+v then %+v", c, d)
	}
	return nil
}

// liveCalls is how many calls checkLive waits for in each state; stallLimit
// how long it, and a measuring window, wait for the executors to run at all.
const (
	liveCalls  = 100
	stallLimit = 60 * time.Second
)

// errNoProgress: the executors did not run at all, for stallLimit.
var errNoProgress = fmt.Errorf("the executors made no progress in %v (no CPU time, no calls)", stallLimit)

// awaitCalls polls t's counts until the executors have made n calls since
// from, and returns those counts; errNoProgress after stallLimit.
func awaitCalls(ctx context.Context, t *Target, from Counts, n uint64) (Counts, error) {
	deadline := time.Now().Add(stallLimit)
	for {
		c, err := t.Counts(ctx)
		if err != nil || c.Calls >= from.Calls+n {
			return c, err
		}
		if time.Now().After(deadline) {
			return c, fmt.Errorf("%w: %+v then %+v", errNoProgress, from, c)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func tempFile(dir, pattern string) string {
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return filepath.Join(dir, pattern)
	}
	f.Close()
	os.Remove(f.Name())
	return f.Name()
}
