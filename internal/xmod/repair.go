package xmod

import (
	"bytes"
	"context"
	"errors"
	"fmt"
)

// Repaired is one torn site that Repair made whole.
type Repaired struct {
	Site Site
	Seen []byte // what the site held: an int3 over bytes of its forms
	On   bool   // the form it holds now: Active (true) or Inert (false)
}

func (r Repaired) String() string {
	form := "inert"
	if r.On {
		form = "active"
	}
	return fmt.Sprintf("%v held % x (an int3 left by an interrupted patch); restored to its %s form % x",
		r.Site, r.Seen, form, r.Site.form(r.On))
}

// repairForm picks the whole form a torn site is restored to: the one its
// bytes 1..n-1 already are, so that only byte 0 changes; inert where both
// agree there (the one-byte placeholders) or the back bytes are a mix of
// both, since a probe that is off records nothing and costs nothing.
func repairForm(s Site, seen []byte) bool {
	return bytes.Equal(seen[1:], s.Active[1:]) && !bytes.Equal(seen[1:], s.Inert[1:])
}

// Repair makes every torn site among sites whole again (StateTorn: an int3
// over bytes of the site's own forms, what an int3 protocol whose tracer
// was killed leaves behind) and reports each; sites in one of their forms
// are left alone, and a site in neither form fails the call before any
// write (*SiteError). It runs the int3 protocol's tail from where the
// interrupted patch stopped: arm the trap (threads that reach the int3 from
// now on are held, not killed), write the back bytes of the chosen form
// where they differ, barrier, write byte 0, release. The barrier is served
// even when only byte 0 changes: the interrupted patch may have died right
// after writing the back bytes, before its own barrier. Like the int3
// protocol's second half, it completes whatever ctx says.
func Repair(ctx context.Context, t Tracer, sites []Site, o Int3Options) ([]Repaired, error) {
	cs := make([]Change, len(sites))
	for i, s := range sites {
		cs[i] = Change{Site: s}
	}
	cs, err := validate(cs)
	if err != nil {
		return nil, err
	}
	var out []Repaired
	err = t.Do(func() error {
		cur, err := readSites(t, cs)
		if err != nil {
			return err
		}
		var bad []error
		for i, c := range cs {
			switch classify(c.Site, cur[i]) {
			case StateInvalid:
				bad = append(bad, &SiteError{Site: c.Site, Seen: append([]byte(nil), cur[i]...)})
			case StateTorn:
				out = append(out, Repaired{Site: c.Site, Seen: append([]byte(nil), cur[i]...), On: repairForm(c.Site, cur[i])})
			}
		}
		if len(bad) > 0 {
			out = nil
			return errors.Join(bad...)
		}
		if len(out) == 0 {
			return nil
		}
		return repairBatch(t, out, o)
	})
	return out, err
}

func repairBatch(t Tracer, rs []Repaired, o Int3Options) error {
	release := func() {
		for _, r := range rs {
			_, _ = t.ReleaseTrap(r.Site.Addr)
		}
	}
	if o.Guard != nil {
		sites := make([]Site, len(rs))
		for i, r := range rs {
			sites[i] = r.Site
		}
		if err := o.Guard.Record(sites); err != nil {
			return fmt.Errorf("listing %d site(s) for the runtime's SIGTRAP handler: %w", len(sites), err)
		}
	}
	for _, r := range rs {
		if err := t.ForkForm(r.Site.Addr, r.Site.form(r.On)); err != nil {
			release()
			return err
		}
		if err := t.ArmTrap(r.Site.Addr); err != nil {
			release()
			return err
		}
	}
	for _, r := range rs {
		nw := r.Site.form(r.On)
		if !bytes.Equal(nw[1:], r.Seen[1:]) {
			if err := t.WriteMem(r.Site.Addr+1, nw[1:]); err != nil {
				release()
				return fmt.Errorf("%v: writing bytes 1..%d: %w", r.Site, len(nw)-1, err)
			}
		}
	}
	syncErr := mustBarrier(t, o)
	if gone(syncErr) {
		release()
		return syncErr
	}
	for _, r := range rs {
		if err := t.WriteMem(r.Site.Addr, r.Site.form(r.On)[:1]); err != nil {
			release()
			return fmt.Errorf("%v: writing byte 0: %w", r.Site, err)
		}
	}
	release()
	if syncErr != nil {
		return fmt.Errorf("sites repaired, but serialisation before the last write failed (time wait only): %w", syncErr)
	}
	return nil
}
