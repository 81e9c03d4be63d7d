package hotpatch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// EnvTestNoGuard makes hotpatch leave the runtime's in-flight table alone,
// as with a runtime that has none (layout version 7 or older): for the
// tests that measure that case's residual (TestKillNine's no-table rows).
const EnvTestNoGuard = "EDGEPROBE_TEST_NO_GUARD"

// ErrHandlerBusy: a thread of the target was still repairing sites in its
// SIGTRAP handler (D90) when hotpatch gave up waiting for it.
var ErrHandlerBusy = errors.New("a thread of the process is repairing sites in its SIGTRAP handler")

// handlerWait bounds the wait for a handler's in-process repair: it makes
// a few pwrites and two membarriers, so seconds mean a thread stopped in it
// (SIGSTOP, a debugger) rather than one still working.
const handlerWait = 10 * time.Second

// EnvTestHandlerWait names a file hotpatch creates when it finds a thread
// repairing in its SIGTRAP handler and starts waiting for it (awaitHandlers):
// for TestHandlerRepairRace, which must know that the wait began.
const EnvTestHandlerWait = "EDGEPROBE_TEST_HANDLER_WAIT"

// inflightGuard is xmod.Guard over the runtime's in-flight table (D89): the
// struct ep_inflight at addr in the target, written through the tracer.
// Entries are appended (the sites first, then count), never rewritten in
// place while they may be needed, so a hotpatch killed at any point leaves
// every site that may hold an int3 listed. They are not removed when a
// protocol ends either: a thread may have executed a site's int3 before
// the site was made whole and reach the runtime's handler later (a
// SIGTRAP passed on by a tracer that did not arm the site, or a handler
// entered and preempted before it read the table); the handler recognises
// that stale trap only while the site is listed. Listing a site again
// costs nothing (the table is read once per session); only when the table
// is full are the entries of whole sites dropped (compact).
type inflightGuard struct {
	t      xmod.Mem // the session's tracer (a fake in guard_test.go)
	addr   uint64
	max    int
	loaded bool
	sites  []shm.InflightSite // the table's entries as this guard knows them
	listed map[uint64]bool
}

// guard returns the session's in-flight guard, or nil (no runtime, or one
// without the table, or EnvTestNoGuard).
func (s *Session) guard() xmod.Guard {
	if s.inflight != nil {
		return s.inflight
	}
	if os.Getenv(EnvTestNoGuard) != "" {
		return nil
	}
	s.openRegion()
	if s.region == nil || s.tracer == nil {
		return nil
	}
	h := s.region.Header()
	if h.Version < 8 || h.Inflight == 0 || h.InflightMax == 0 {
		return nil
	}
	s.inflight = &inflightGuard{t: s.tracer, addr: h.Inflight, max: int(min(h.InflightMax, shm.InflightMax)), listed: map[uint64]bool{}}
	return s.inflight
}

func (g *inflightGuard) Cap() int { return g.max }

func (g *inflightGuard) u64(off uint64) (uint64, error) {
	var b [8]byte
	if err := g.t.ReadMem(g.addr+off, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

func (g *inflightGuard) setCount(n int) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(n))
	return g.t.WriteMem(g.addr+shm.InflightCountOff, b[:])
}

// load reads what an earlier (killed) hotpatch left listed: it stays
// listed until its sites are whole.
func (g *inflightGuard) load() error {
	if g.loaded {
		return nil
	}
	n, err := g.u64(shm.InflightCountOff)
	if err != nil {
		return err
	}
	if n > uint64(g.max) {
		n = uint64(g.max) // the handler reads no further either
	}
	if n > 0 {
		b := make([]byte, n*shm.InflightSiteSize)
		if err := g.t.ReadMem(g.addr+shm.InflightSitesOff, b); err != nil {
			return err
		}
		g.sites = shm.DecodeInflightSites(b)
		for _, e := range g.sites {
			g.listed[e.Addr] = true
		}
	}
	g.loaded = true
	return nil
}

// Record appends the sites not yet listed, then the new count: an entry is
// complete before the handler can read it.
func (g *inflightGuard) Record(sites []xmod.Site) error {
	if err := g.load(); err != nil {
		return err
	}
	var buf []byte
	var add []shm.InflightSite
	seen := map[uint64]bool{}
	for _, s := range sites {
		if g.listed[s.Addr] || seen[s.Addr] {
			continue
		}
		seen[s.Addr] = true
		var err error
		if buf, err = shm.EncodeInflightSite(buf, s.Addr, s.Active, s.Inert); err != nil {
			return err
		}
		add = append(add, shm.DecodeInflightSites(buf[len(buf)-shm.InflightSiteSize:])...)
	}
	if len(add) == 0 {
		return nil
	}
	if len(g.sites)+len(add) > g.max {
		if err := g.compact(); err != nil {
			return err
		}
		if len(g.sites)+len(add) > g.max {
			return fmt.Errorf("%d listed, %d more: %w (%d)", len(g.sites), len(add), xmod.ErrGuardFull, g.max)
		}
	}
	if err := g.t.WriteMem(g.addr+shm.InflightSitesOff+uint64(len(g.sites))*shm.InflightSiteSize, buf); err != nil {
		return err
	}
	if err := g.setCount(len(g.sites) + len(add)); err != nil {
		return err
	}
	g.sites = append(g.sites, add...)
	for _, e := range add {
		g.listed[e.Addr] = true
	}
	return nil
}

// compact drops the entries of sites that hold no int3, moving the others
// down one entry at a time in increasing order, count last: killed at any
// point, every kept entry is still at its old index (not yet overwritten:
// a write goes to an index no higher than the entry being read) or already
// at its new one, and count still covers both.
func (g *inflightGuard) compact() error {
	var b [1]byte
	var kept []shm.InflightSite
	for _, e := range g.sites {
		if e.Len == 0 || e.Len >= shm.SiteMax {
			continue // not an entry the handler reads either
		}
		if g.t.ReadMem(e.Addr, b[:]) != nil || b[0] != 0xcc {
			// Unreadable: its object was unmapped (dlclose) since it
			// was listed; nothing of ours can be there.
			continue
		}
		var buf []byte
		buf, err := shm.EncodeInflightSite(buf, e.Addr, e.Active[:e.Len], e.Inert[:e.Len])
		if err != nil {
			return err
		}
		if err := g.t.WriteMem(g.addr+shm.InflightSitesOff+uint64(len(kept))*shm.InflightSiteSize, buf); err != nil {
			return err
		}
		kept = append(kept, e)
	}
	if err := g.setCount(len(kept)); err != nil {
		return err
	}
	g.sites = kept
	clear(g.listed)
	for _, e := range kept {
		g.listed[e.Addr] = true
	}
	return nil
}

// awaitHandlers waits, once per session, until no thread of the target is
// inside its SIGTRAP handler's in-process repair (D90). The session has
// held the leader since Open (the lock); a handler writes only after it has
// taken the table's lock and found neither its thread nor the leader
// traced, so once the lock is seen free no handler writes again while this
// session holds the process. Called before the sites are read for any
// protocol but flip (int3 and int3-async write int3s, which a handler
// would repair; stop, for simplicity) and before a repair (which writes
// sites holding int3, as a handler does). Flip is left out: it writes byte
// 0 of whole sites only (a site holding int3 is repaired first, through
// repair), and a handler writes only sites holding int3; its span writes
// check every probe site they cover for a whole form right before the write
// (docs/protocols.md, "Batches at page speed"), so a site a handler is
// repairing makes the span fall back to one-byte writes.
func (s *Session) awaitHandlers() error {
	if s.handlersDone {
		return nil
	}
	// The region's flock before the lock word is read: the runtime's
	// handler checks it after taking the lock, as it checks the leader's
	// tracer (D101).
	if err := s.Hold(); err != nil {
		return err
	}
	g, _ := s.guard().(*inflightGuard)
	if g == nil {
		s.handlersDone = true
		return nil
	}
	deadline := time.Now().Add(handlerWait)
	for first := true; ; first = false {
		lock, err := g.u64(shm.InflightLockOff)
		if err != nil {
			return err
		}
		if lock == 0 {
			s.handlersDone = true
			return nil
		}
		if p := os.Getenv(EnvTestHandlerWait); first && p != "" {
			_ = os.WriteFile(p, nil, 0o644)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d: thread %d, after %v: %w", s.pid, lock, handlerWait, ErrHandlerBusy)
		}
		s.tracer.Pause(time.Millisecond) // serves the tracer's events meanwhile
	}
}

// regionHoldWait bounds Hold's retries: the runtime's SIGTRAP handler
// holds the region's flock only for the moment it looks, and a hotpatch
// of this namespace that held the process before us (--wait) only until
// its Close, right after its detach; as long as the wait for a handler,
// so that a loaded machine's scheduling is not taken for a holder.
const regionHoldWait = handlerWait

// Hold takes an exclusive flock of the runtime's region file (through
// /proc/PID/fd/N: the memfd's own inode), kept until Close (D101). The
// runtime's SIGTRAP handler repairs in-process only while no hotpatch
// holds the process; it sees a tracer in its own pid namespace
// (TracerPid) and the flock of /proc/PID/fd of its own /proc (D95), but
// not a hotpatch outside its pid namespace (TracerPid reads 0 there) or
// one reading another /proc instance: it sees this flock. awaitHandlers
// takes it before it reads the repair lock (every int3 protocol and
// repair); a session takes it at its start. A process without the
// runtime has nothing to hold. Held by another open file for longer than
// regionHoldWait: another hotpatch holds the process, ErrBusy.
func (s *Session) Hold() error {
	if s.regionHeld {
		return nil
	}
	s.openRegion()
	if s.region == nil {
		return nil
	}
	deadline := time.Now().Add(regionHoldWait)
	for {
		err := s.region.TryLock()
		if err == nil {
			s.regionHeld = true
			return nil
		}
		if err != unix.EWOULDBLOCK {
			return nil // no file to hold (the checks of the tracer stand)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d: the runtime's region is locked by another hotpatch (one outside the process's pid namespace, or reading another /proc): %w", s.shown, ErrBusy)
		}
		if s.tracer != nil {
			s.tracer.Pause(time.Millisecond) // serves the tracer's events meanwhile
		} else {
			time.Sleep(time.Millisecond)
		}
	}
}
