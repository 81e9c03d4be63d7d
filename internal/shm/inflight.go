package shm

import (
	"encoding/binary"
	"fmt"
)

// The in-flight table (struct ep_inflight in runtime/edgeprobe_shm.h,
// version 8, D89): the sites an int3 protocol is about to put an int3 on,
// which the runtime's SIGTRAP handler completes or waits out if the tracer
// is killed (docs/protocols.md, "SIGKILL and repair"). It lives in the
// process's own memory at Header.Inflight, not in the region: hotpatch
// reads and writes it through /proc/PID/mem.
const (
	InflightMax      = 16384 // EP_INFLIGHT_MAX: sites the table holds
	SiteMax          = 16    // EP_SITE_MAX: bytes kept of each form
	InflightSiteSize = 48    // sizeof(struct ep_inflight_site)

	InflightCountOff   = 0  // uint64: sites valid (written after them)
	InflightLockOff    = 8  // uint64: tid of a handler repairing in-process, or 0
	InflightTrapsOff   = 16 // uint64: traps at a listed site the handler took
	InflightRepairsOff = 24 // uint64: sites the handler made whole
	InflightHoldsOff   = 32 // uint64: traps the handler could not repair at once
	InflightSitesOff   = 64 // struct ep_inflight_site[InflightMax]
)

// InflightSite is struct ep_inflight_site.
type InflightSite struct {
	Addr   uint64
	Len    uint32
	_      uint32
	Active [SiteMax]byte
	Inert  [SiteMax]byte
}

// inflightHead is struct ep_inflight (for the layout test only: the table
// is read and written as bytes).
type inflightHead struct {
	Count   uint64
	Lock    uint64
	Traps   uint64
	Repairs uint64
	Holds   uint64
	_       [3]uint64
	Site    [InflightMax]InflightSite
}

// EncodeInflightSite appends the table entry of a site at addr with the
// given forms (equal lengths, 1..SiteMax-1 bytes) to b.
func EncodeInflightSite(b []byte, addr uint64, active, inert []byte) ([]byte, error) {
	if len(active) == 0 || len(active) != len(inert) || len(active) >= SiteMax {
		return b, fmt.Errorf("shm: in-flight site at %#x: forms of %d and %d bytes: %w", addr, len(active), len(inert), ErrLayout)
	}
	var e [InflightSiteSize]byte
	binary.LittleEndian.PutUint64(e[0:], addr)
	binary.LittleEndian.PutUint32(e[8:], uint32(len(active)))
	copy(e[16:16+SiteMax], active)
	copy(e[32:32+SiteMax], inert)
	return append(b, e[:]...), nil
}

// DecodeInflightSites reads table entries from b (a whole number of them).
func DecodeInflightSites(b []byte) []InflightSite {
	out := make([]InflightSite, 0, len(b)/InflightSiteSize)
	for len(b) >= InflightSiteSize {
		var s InflightSite
		s.Addr = binary.LittleEndian.Uint64(b[0:])
		s.Len = binary.LittleEndian.Uint32(b[8:])
		copy(s.Active[:], b[16:16+SiteMax])
		copy(s.Inert[:], b[32:32+SiteMax])
		out = append(out, s)
		b = b[InflightSiteSize:]
	}
	return out
}
