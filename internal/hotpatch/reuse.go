package hotpatch

import (
	"bytes"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// ReuseWithin bounds how old a read may be for the next command of a Batch
// to write from it instead of reading again (D64, docs/protocols.md,
// "Repeated requests"): the time from the start of the previous command's
// read after to the start of this command. A command inside a Batch
// follows the previous one after a microsecond or two of Go work; a gap
// longer than this (the thread preempted, a collection) gets a fresh read.
const ReuseWithin = 20 * time.Microsecond

// lastRead is what a flip-only Apply inside a Batch leaves for the next
// one: its selection, whose read after (every site read, none confirmed by
// a span read-back) found every site in its asked form, the Batch's memory
// and when that read started.
type lastRead struct {
	p   *prepared
	mem *ptrace.ThreadMem
	at  time.Time
}

// readBefore is Apply's read before for p, started at now: for a
// flip-only p, the previous Apply's read after (l) when that is the same
// sites, in the same Batch, started less than ReuseWithin before now and
// found every site as asked; else one grouped read (Prepared.Classify).
// Apply takes l from the session when it starts, so a read is used at
// most once, and never across a command that failed or wrote anything
// else.
func (s *Session) readBefore(p *prepared, l lastRead, now time.Time) ([]xmod.State, error) {
	within := s.reuseWithin
	if within == 0 {
		within = ReuseWithin
	}
	if l.p != nil && p.onlyFlip && s.threadMem != nil && l.mem == s.threadMem && within > 0 && now.Sub(l.at) < within && sameSites(l.p, p) {
		s.reused++
		// Every site of l.p ended as asked (Apply's OK), and l.p's sites
		// are p's, in the same order.
		return append(p.before[:0], l.p.want...), nil
	}
	return p.batch.Classify(s.reader(), p.before)
}

// keepAfter records the read after of an Apply of p that started at `at`
// and found every site as asked, for the next Apply (readBefore). Only
// the one-byte path qualifies: there every site was read by that read
// (a span's read-back, which stands in for it, is older: D50).
func (s *Session) keepAfter(p *prepared, at time.Time) {
	if s.threadMem == nil || !p.onlyFlip || (p.batch.Len() >= spanMin && !s.noSpans) {
		return
	}
	s.last = lastRead{p: p, mem: s.threadMem, at: at}
}

// sameSites reports whether a and b select the same sites in the same
// order (an enable and a disable of one selector).
func sameSites(a, b *prepared) bool {
	if a == b {
		return true
	}
	if len(a.sites) != len(b.sites) {
		return false
	}
	for i := range a.sites {
		x, y := &a.sites[i], &b.sites[i]
		if x.Addr != y.Addr || !bytes.Equal(x.Active, y.Active) || !bytes.Equal(x.Inert, y.Inert) {
			return false
		}
	}
	return true
}
