package xmod

import (
	"errors"
	"fmt"
)

// ErrGuardFull: more sites would be in flight at once than the target's
// in-flight table holds.
var ErrGuardFull = errors.New("too many sites in flight for the runtime's table")

// Guard lists the sites an int3 protocol puts an int3 on where the target
// itself can find them: in the edgeprobe runtime's in-flight table (D89,
// docs/protocols.md "SIGKILL and repair"). If the tracer is killed with an
// int3 in the text, the runtime's SIGTRAP handler recognises a trap at a
// listed site, rewinds the thread to the site and makes the site whole (or
// waits until someone does) instead of letting the process die of SIGTRAP.
// nil (no runtime, or one without the table): today's residual.
type Guard interface {
	// Cap is how many sites may be listed at once.
	Cap() int
	// Record lists sites before the first int3 of any of them is written;
	// on error the protocol writes nothing and fails. Sites stay listed
	// after the protocol (a stale trap may reach the handler later): the
	// guard decides when an entry may go.
	Record(sites []Site) error
}

// guardRecord records the sites of todo with g (nil: nothing to do).
func guardRecord(g Guard, todo []Change) error {
	if g == nil || len(todo) == 0 {
		return nil
	}
	sites := make([]Site, len(todo))
	for i, c := range todo {
		sites[i] = c.Site
	}
	if err := g.Record(sites); err != nil {
		return fmt.Errorf("listing %d site(s) for the runtime's SIGTRAP handler: %w", len(sites), err)
	}
	return nil
}
