package xmod

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/ptrace"
)

// DefaultWait is the int3 protocols' wait between phases until a calibration
// of T_max exists for the machine: about 100x the T_max the paper measured.
const DefaultWait = 50 * time.Microsecond

// Int3Options tune the int3 protocols.
type Int3Options struct {
	// Wait is the time waited after each phase before the next write (the
	// paper's T_max wait). Zero means DefaultWait; negative means none.
	Wait time.Duration
	// NoSync skips the serialisation after each phase (every thread is
	// interrupted and resumed once, so each passes through the kernel) and
	// relies on Wait alone. The time wait alone is unproven on this machine
	// class (see docs/protocols.md); keep Sync unless measuring.
	NoSync bool
	// Guard, when set, lists every site in the target's in-flight table
	// before its int3 is written (D89); nil: none (an old runtime, or none).
	Guard Guard
}

func (o Int3Options) wait() time.Duration {
	switch {
	case o.Wait == 0:
		return DefaultWait
	case o.Wait < 0:
		return 0
	}
	return o.Wait
}

const int3 = 0xcc

// barrier ends a phase: wait, then (unless NoSync) make every thread pass
// through the kernel. The wait is always served in full; only the Sync can
// fail (ctx, timeout, exit).
func barrier(ctx context.Context, t Tracer, o Int3Options) error {
	if d := o.wait(); d > 0 {
		t.Pause(d)
	} else {
		t.Pump()
	}
	if o.NoSync {
		return nil
	}
	return t.Sync(ctx)
}

// mustBarrier is the barrier of a phase that cannot be abandoned (the back
// bytes are already written): a cancelled ctx does not cut the Sync short;
// the Sync gets its own timeout instead.
func mustBarrier(t Tracer, o Int3Options) error {
	return barrier(context.Background(), t, o)
}

func gone(err error) bool {
	return errors.Is(err, ptrace.ErrExited) || errors.Is(err, ptrace.ErrExec) || errors.Is(err, ptrace.ErrDetached)
}

// Int3 applies a batch with the text_poke_bp order, synchronously: int3 on
// byte 0 of every site, barrier, bytes 1..n-1, barrier, byte 0. Threads that
// reach a site meanwhile trap and are held by the tracer until the site is
// complete, then resume at the site. Each site is checked first; a site in
// neither form fails the batch before any write.
//
// Interruption: until the back bytes are written, a cancelled ctx (or a
// failed Sync) rolls the batch back by restoring byte 0 (one atomic byte;
// the rest of each site was never touched). Once back bytes are written the
// batch is completed whatever ctx says. If the target exits, the error wraps
// ptrace.ErrExited. On return every site holds its old or its new form.
func Int3(ctx context.Context, t Tracer, changes []Change, opts Int3Options) (Result, error) {
	var res Result
	cs, err := validate(changes)
	if err != nil {
		return res, err
	}
	err = t.Do(func() error {
		todo, old, unchanged, err := plan(t, cs)
		res.Unchanged = unchanged
		if err != nil || len(todo) == 0 {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		// A batch larger than the in-flight table is applied as several,
		// each one whole protocol run (every site of a run listed).
		n := len(todo)
		if opts.Guard != nil && opts.Guard.Cap() > 0 && opts.Guard.Cap() < n {
			n = opts.Guard.Cap()
		}
		for i := 0; i < len(todo); i += n {
			j := min(i+n, len(todo))
			if i > 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			held, err := int3Batch(ctx, t, todo[i:j], old[i:j], opts)
			res.Held += held
			if err != nil {
				return err
			}
			res.Changed += j - i
		}
		return nil
	})
	return res, err
}

func int3Batch(ctx context.Context, t Tracer, todo []Change, old [][]byte, o Int3Options) (held int, err error) {
	release := func() {
		for _, c := range todo {
			n, _ := t.ReleaseTrap(c.Site.Addr)
			held += n
		}
	}
	// Phase 1: int3 on byte 0 of every site. A child forked from here on
	// gets the old form back wherever it inherited the int3.
	for i, c := range todo {
		if err := t.ForkForm(c.Site.Addr, old[i]); err != nil {
			release()
			return held, err
		}
		if err := t.ArmTrap(c.Site.Addr); err != nil {
			release()
			return held, err
		}
	}
	if err := guardRecord(o.Guard, todo); err != nil {
		release()
		return held, err
	}
	for i, c := range todo {
		if err := t.WriteMem(c.Site.Addr, []byte{int3}); err != nil {
			if !gone(err) {
				restoreFront(t, todo[:i], old[:i])
			}
			release()
			return held, fmt.Errorf("%v: writing int3: %w", c.Site, err)
		}
	}
	if err := barrier(ctx, t, o); err != nil {
		if gone(err) {
			release()
			return held, err
		}
		// Roll back: byte 0 back to its old value; bytes 1..n-1 were never
		// touched, so each site is whole again at once.
		restoreFront(t, todo, old)
		release()
		return held, fmt.Errorf("int3 phase (rolled back): %w", err)
	}
	// Phase 2: bytes 1..n-1, where they differ.
	back := false
	for i, c := range todo {
		nw := c.Site.form(c.On)
		if !bytes.Equal(nw[1:], old[i][1:]) {
			if err := t.WriteMem(c.Site.Addr+1, nw[1:]); err != nil {
				if gone(err) {
					release()
					return held, err
				}
				// Cannot happen for a page we just wrote; put every site back.
				restoreAll(t, todo, old, o)
				release()
				return held, fmt.Errorf("%v: writing bytes 1..%d: %w", c.Site, len(nw)-1, err)
			}
			back = true
		}
	}
	var syncErr error
	if back {
		syncErr = mustBarrier(t, o)
		if gone(syncErr) {
			release()
			return held, syncErr
		}
		// A Sync that timed out still had its full time wait; complete the
		// batch (the alternative, restoring, needs the same barrier).
	}
	// Phase 3: byte 0. Every site gets its write even if one fails (a
	// failed write is retried once): stopping at the first failure would
	// release the traps with int3s still in the text (found by the fake
	// tracer's failure injection, fake_test.go).
	var werrs []error
	for _, c := range todo {
		err := t.WriteMem(c.Site.Addr, c.Site.form(c.On)[:1])
		if err != nil && !gone(err) {
			err = t.WriteMem(c.Site.Addr, c.Site.form(c.On)[:1])
		}
		if err != nil {
			werrs = append(werrs, fmt.Errorf("%v: writing byte 0: %w", c.Site, err))
		}
	}
	release()
	if len(werrs) > 0 {
		return held, errors.Join(werrs...)
	}
	if syncErr != nil {
		return held, fmt.Errorf("batch completed, but serialisation before the last write failed (time wait only): %w", syncErr)
	}
	return held, nil
}

// restoreFront writes each site's old byte 0 (over the int3).
func restoreFront(t Tracer, todo []Change, old [][]byte) {
	for i, c := range todo {
		_ = t.WriteMem(c.Site.Addr, old[i][:1])
	}
}

// restoreAll puts the old back bytes back behind the int3s, waits, and
// restores byte 0: the same protocol towards the old form.
func restoreAll(t Tracer, todo []Change, old [][]byte, o Int3Options) {
	for i, c := range todo {
		_ = t.WriteMem(c.Site.Addr+1, old[i][1:])
	}
	_ = mustBarrier(t, o)
	restoreFront(t, todo, old)
}

// ---- asynchronous ----

type phase int

const (
	firstWait  phase = iota // int3 written, waiting to write bytes 1..n-1
	secondWait              // bytes 1..n-1 written, waiting to write byte 0
)

type patch struct {
	c     Change
	old   []byte
	state phase
	stamp time.Time
}

// Async is the paper's asynchronous int3 protocol (Figs. 6-7): Start writes
// the int3s and returns; each Finish advances every patch whose wait has
// elapsed by one phase (FIRST_WAIT -> SECOND_WAIT -> finished), after one
// Sync covering all of them. Many patches may be outstanding; a site may have
// only one. All methods are safe to call from any goroutine (they run on the
// tracer thread). Call Drain or Abort before detaching.
type Async struct {
	t       Tracer
	opts    Int3Options
	pending []*patch
	held    int
}

// NewAsync returns an asynchronous patcher on t.
func NewAsync(t Tracer, opts Int3Options) *Async { return &Async{t: t, opts: opts} }

// Pending returns the number of outstanding patches.
func (a *Async) Pending() int {
	n := 0
	_ = a.t.Do(func() error { n = len(a.pending); return nil })
	return n
}

// Held returns how many trapped threads finished patches have resumed.
func (a *Async) Held() int { return a.held }

// Start checks the sites, writes int3 on byte 0 of each one that needs a
// change and returns without waiting.
func (a *Async) Start(ctx context.Context, changes []Change) (Result, error) {
	var res Result
	cs, err := validate(changes)
	if err != nil {
		return res, err
	}
	err = a.t.Do(func() error {
		if err := ctx.Err(); err != nil {
			return err
		}
		for _, c := range cs {
			for _, p := range a.pending {
				s := p.c.Site
				if c.Site.Addr < s.Addr+uint64(s.Len()) && s.Addr < c.Site.Addr+uint64(c.Site.Len()) {
					return fmt.Errorf("%v: %w", c.Site, ErrBusy)
				}
			}
		}
		todo, old, unchanged, err := plan(a.t, cs)
		res.Unchanged = unchanged
		if err != nil {
			return err
		}
		if a.opts.Guard != nil && a.opts.Guard.Cap() > 0 && len(a.pending)+len(todo) > a.opts.Guard.Cap() {
			return fmt.Errorf("%d site(s) in flight, %d more: %w (%d)", len(a.pending), len(todo), ErrGuardFull, a.opts.Guard.Cap())
		}
		if err := guardRecord(a.opts.Guard, todo); err != nil {
			return err
		}
		for i, c := range todo {
			if err := a.t.ForkForm(c.Site.Addr, old[i]); err != nil {
				return err
			}
			if err := a.t.ArmTrap(c.Site.Addr); err != nil {
				return err
			}
			if err := a.t.WriteMem(c.Site.Addr, []byte{int3}); err != nil {
				n, _ := a.t.ReleaseTrap(c.Site.Addr)
				a.held += n
				return fmt.Errorf("%v: writing int3: %w", c.Site, err)
			}
			a.pending = append(a.pending, &patch{c: c, old: old[i], state: firstWait, stamp: time.Now()})
			res.Changed++
		}
		return nil
	})
	return res, err
}

// Finish advances every patch whose wait has elapsed and returns how many
// remain outstanding. If the Sync fails nothing advances (every site stays
// valid, guarded by its int3) and the error is returned.
func (a *Async) Finish(ctx context.Context) (int, error) {
	n := 0
	err := a.t.Do(func() error {
		err := a.finish(ctx)
		n = len(a.pending)
		return err
	})
	return n, err
}

func (a *Async) finish(ctx context.Context) error {
	now := time.Now()
	var due []*patch
	for _, p := range a.pending {
		if now.Sub(p.stamp) >= a.opts.wait() {
			due = append(due, p)
		}
	}
	if len(due) == 0 {
		a.t.Pump()
		return nil
	}
	if !a.opts.NoSync {
		if err := a.t.Sync(ctx); err != nil {
			if gone(err) {
				a.dropAll()
			}
			return err
		}
	}
	now = time.Now()
	for _, p := range due {
		switch p.state {
		case secondWait:
			if err := a.complete(p); err != nil {
				return err
			}
		case firstWait:
			nw := p.c.Site.form(p.c.On)
			if bytes.Equal(nw[1:], p.old[1:]) {
				if err := a.complete(p); err != nil {
					return err
				}
				continue
			}
			if err := a.t.WriteMem(p.c.Site.Addr+1, nw[1:]); err != nil {
				if gone(err) {
					a.dropAll()
				}
				return fmt.Errorf("%v: writing bytes 1..%d: %w", p.c.Site, len(nw)-1, err)
			}
			p.state, p.stamp = secondWait, now
		}
	}
	return nil
}

// complete writes byte 0 of the new form, resumes held threads, forgets p.
func (a *Async) complete(p *patch) error {
	err := a.t.WriteMem(p.c.Site.Addr, p.c.Site.form(p.c.On)[:1])
	if err != nil && !gone(err) {
		return fmt.Errorf("%v: writing byte 0: %w", p.c.Site, err)
	}
	n, _ := a.t.ReleaseTrap(p.c.Site.Addr)
	a.held += n
	a.remove(p)
	if err != nil {
		a.dropAll()
	}
	return err
}

func (a *Async) remove(p *patch) {
	for i, q := range a.pending {
		if q == p {
			a.pending = append(a.pending[:i], a.pending[i+1:]...)
			return
		}
	}
}

func (a *Async) dropAll() {
	for _, p := range a.pending {
		n, _ := a.t.ReleaseTrap(p.c.Site.Addr)
		a.held += n
	}
	a.pending = nil
}

// Drain finishes every outstanding patch. If ctx is cancelled it aborts
// instead (Abort's rules), and returns ctx's error.
func (a *Async) Drain(ctx context.Context) error {
	for {
		n, err := a.Finish(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return errors.Join(err, a.Abort())
			}
			return err
		}
		if n == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return errors.Join(ctx.Err(), a.Abort())
		}
		a.t.Pause(a.opts.wait() / 4)
	}
}

// Abort brings every outstanding site back to a valid form at once: a patch
// still in its first wait is rolled back (byte 0 restored over the int3);
// one whose back bytes are written is completed after its barrier.
func (a *Async) Abort() error {
	return a.t.Do(func() error {
		var errs []error
		var second []*patch
		for _, p := range append([]*patch(nil), a.pending...) {
			if p.state == firstWait {
				if err := a.t.WriteMem(p.c.Site.Addr, p.old[:1]); err != nil && !gone(err) {
					errs = append(errs, err)
				}
				n, _ := a.t.ReleaseTrap(p.c.Site.Addr)
				a.held += n
				a.remove(p)
			} else {
				second = append(second, p)
			}
		}
		if len(second) > 0 {
			if err := mustBarrier(a.t, a.opts); err != nil && gone(err) {
				a.dropAll()
				return errors.Join(append(errs, err)...)
			}
			for _, p := range second {
				if err := a.complete(p); err != nil {
					errs = append(errs, err)
				}
			}
		}
		return errors.Join(errs...)
	})
}
