package report

import (
	"fmt"
	"math/bits"
	"strings"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
	"github.com/edgeprobe/edgeprobe/internal/shm"
)

// CheckSums is the error for the first function whose counts wrap
// (shm.Func.Overflow, D92), naming it; nil when none does. Every report of
// counts (stats, top, profile, trace --rate) asks it before it prints a
// number: a sum held at 2^64-1, or one that wrapped to a small number, is
// not the process's calls.
func CheckSums(funcs []shm.Func, sym *Symbolizer) error {
	for i := range funcs {
		f := &funcs[i]
		if len(f.Overflow) == 0 {
			continue
		}
		name, obj := sym.Name(f.Addr, !f.Bare)
		return fmt.Errorf("%w: %w: function %s (%#x in %s): %s (the program wrote its own counters, or they are corrupt)",
			shm.ErrUntrusted, shm.ErrOverflow, calltrace.Printable(name), f.Addr, calltrace.Printable(obj), strings.Join(f.Overflow, ", "))
	}
	return nil
}

// CheckCounters is CheckSums for the region-wide counters.
func CheckCounters(c *shm.Counters) error {
	if len(c.Overflow) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w: the region-wide counts %s (the program wrote its own counters, or they are corrupt)",
		shm.ErrUntrusted, shm.ErrOverflow, strings.Join(c.Overflow, ", "))
}

// sum is a+b, or ok false when it passes 2^64.
func sum(a, b uint64) (s uint64, ok bool) {
	s, c := bits.Add64(a, b, 0)
	return s, c == 0
}
