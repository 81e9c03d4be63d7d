package xmod

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/ptrace"
)

// StopOptions tune Stop.
type StopOptions struct {
	// Retries bounds how often the world is stopped again because a thread
	// stood strictly inside a site. Zero means 100.
	Retries int
	// RetryRun is how long the threads run between attempts. Zero means 100µs.
	RetryRun time.Duration
}

// Stop is the stop-the-world baseline: interrupt every thread and wait until
// each is in a ptrace-stop, check that no thread's PC lies strictly inside a
// site (a PC inside would resume in the middle of the new bytes; if one does,
// resume everything briefly and try again), write every site whole, resume.
// A stopped thread executes nothing, and its return to user mode after the
// stop refetches the instructions, so no thread can see a torn site. Sites
// are read and checked while the world is stopped; a site in neither form
// fails the batch before any write. A cancelled ctx before the writes leaves
// everything as it was; the writes themselves are not interrupted.
func Stop(ctx context.Context, t Tracer, changes []Change, opts StopOptions) (Result, error) {
	var res Result
	cs, err := validate(changes)
	if err != nil {
		return res, err
	}
	if opts.Retries == 0 {
		opts.Retries = 100
	}
	if opts.RetryRun == 0 {
		opts.RetryRun = 100 * time.Microsecond
	}
	err = t.Do(func() error {
		for attempt := 0; ; attempt++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			threads, err := t.StopAll(ctx)
			if err != nil {
				return errors.Join(err, t.ResumeAll())
			}
			inside := insideSite(threads, cs)
			if inside == "" {
				werr := stopWrite(t, cs, &res)
				return errors.Join(werr, t.ResumeAll())
			}
			if err := t.ResumeAll(); err != nil {
				return err
			}
			if attempt >= opts.Retries {
				return fmt.Errorf("%s after %d attempts: %w", inside, attempt+1, ErrRetries)
			}
			t.Pause(opts.RetryRun)
		}
	})
	return res, err
}

func stopWrite(t Tracer, cs []Change, res *Result) error {
	todo, _, unchanged, err := plan(t, cs)
	res.Unchanged = unchanged
	if err != nil {
		return err
	}
	for _, c := range todo {
		if err := t.WriteMem(c.Site.Addr, c.Site.form(c.On)); err != nil {
			return fmt.Errorf("%v: %w", c.Site, err)
		}
		res.Changed++
	}
	return nil
}

// insideSite names a thread whose PC lies strictly inside a site, or "".
func insideSite(threads []ptrace.ThreadState, cs []Change) string {
	for _, th := range threads {
		pc := th.Regs.Rip
		for _, c := range cs {
			if pc > c.Site.Addr && pc < c.Site.Addr+uint64(c.Site.Len()) {
				return fmt.Sprintf("thread %d at %#x inside %v", th.Tid, pc, c.Site)
			}
		}
	}
	return ""
}
