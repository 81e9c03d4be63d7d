package hotpatch

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/edgeprobe/edgeprobe/internal/elfsafe"
	"github.com/edgeprobe/edgeprobe/internal/elfscan"
	"github.com/edgeprobe/edgeprobe/internal/probecache"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procmaps"
)

// ErrUnverified means a probe list names a site that a scan of the mapped
// object does not confirm: not a hook call or jump starting at that address
// with the listed encoding and forms. Nothing is written.
var ErrUnverified = errors.New("probe list disagrees with a scan of the object")

// verify checks every selected probe that comes from a probe-list file
// against a scan of the object the process maps (cached by build-id in the
// probe cache), before anything is written: the live-bytes check alone
// (each site holds its active or inert form) would let a list with the
// right build-id write a well-formed but wrong instruction, at an address
// inside another instruction, or a jmp where a call was (issue 11).
//
// A site the scan lists at that address must have the listed encoding and
// hook, the same active form, and an inert form that is its flip or NOP
// placeholder. A site the scan does not list is accepted only as a NOP
// placeholder (which no scan can recognise as a hook call): the file must
// hold the listed inert NOP at the listed offset, and a scan of the file
// with the listed active form put back there must find exactly that site.
//
// A session verifies each probe once: profile and trace toggle the same
// sites many times a second.
func (s *Session) verify(sel []selected) error {
	byTarget := map[*Target][]*probelist.Probe{}
	var order []*Target
	var last *Target // sel comes target by target: one map access per run
	var probes []*probelist.Probe
	for _, c := range sel {
		if c.target.Origin == "scan" || s.verifiedAll[c.target] || s.verified[verifiedKey{c.target, c.probe.ID}] {
			continue // the list is the scan, or checked already
		}
		if c.target != last {
			if last != nil {
				byTarget[last] = probes
			}
			if _, ok := byTarget[c.target]; !ok {
				order = append(order, c.target)
			}
			last, probes = c.target, byTarget[c.target]
		}
		probes = append(probes, c.probe)
	}
	if last != nil {
		byTarget[last] = probes
	}
	for _, t := range order {
		ps := byTarget[t]
		if err := verifyTargetCached(s.pid, t, ps); err != nil {
			return err
		}
		if len(ps) == t.List.Len() && distinct(ps) {
			// The whole list: one entry, not one per probe (a
			// `--enable '*'` of 40,000 probes).
			if s.verifiedAll == nil {
				s.verifiedAll = map[*Target]bool{}
			}
			s.verifiedAll[t] = true
			continue
		}
		if s.verified == nil {
			s.verified = make(map[verifiedKey]bool, len(ps))
		}
		for _, p := range ps {
			s.verified[verifiedKey{t, p.ID}] = true
		}
	}
	return nil
}

// distinct reports whether the probes' ids are all different (then as
// many probes as the list holds are the whole list).
func distinct(ps []*probelist.Probe) bool {
	for i := 1; i < len(ps); i++ {
		if ps[i].ID <= ps[i-1].ID {
			// Not ascending: the general check.
			seen := make(map[int]bool, len(ps))
			for _, p := range ps {
				if seen[p.ID] {
					return false
				}
				seen[p.ID] = true
			}
			return true
		}
	}
	return true
}

type verifiedKey struct {
	t  *Target
	id int
}

// verifyCacheMin is the selection from which verify consults the probe
// cache's record of whole lists already checked against a scan (it must
// also be half the list or more): below it, checking the selected probes
// costs less than the digests of the list and the scan.
const verifyCacheMin = 256

// verifyTargetCached is verifyTarget with the probe cache's record of
// lists checked whole: a large selection of a list that agreed, every
// probe of it, with the scan of the same bytes (probelist.Index.Digest of
// both compact forms) is not checked again; a selection of a whole list
// that passes, every probe on the scan's word (no NOP placeholder, an
// object the scan sees), is recorded. A `hotpatch --enable '*'` of a
// 40,000-probe list otherwise checks every probe on every call (D54).
func verifyTargetCached(pid int, t *Target, probes []*probelist.Probe) error {
	if len(probes) < verifyCacheMin || 2*len(probes) < t.List.Len() {
		return verifyTarget(pid, t, probes)
	}
	cache, _ := probecache.Default()
	scan, err := ScanObject(pid, t.Object)
	if cache == nil || err != nil || scan == nil {
		return verifyAgainst(pid, t, probes, scan, err)
	}
	list, sd := t.List.Digest(), scan.Digest()
	if cache.Verified(list, sd) {
		return nil
	}
	if err := verifyAgainst(pid, t, probes, scan, nil); err != nil {
		return err
	}
	if len(probes) == t.List.Len() && allOnScan(scan, probes) {
		cache.SetVerified(list, sd)
	}
	return nil
}

// allOnScan reports whether the scan lists a site at every probe's
// address: verifyTarget then checked each against the scan alone (a NOP
// placeholder, which it checks against the object's file, is not on it).
func allOnScan(scan *probelist.Index, probes []*probelist.Probe) bool {
	for _, p := range probes {
		if sp, _, err := scan.At(uint64(p.Address)); err != nil || sp == nil {
			return false
		}
	}
	return true
}

func verifyTarget(pid int, t *Target, probes []*probelist.Probe) error {
	scan, err := ScanObject(pid, t.Object)
	return verifyAgainst(pid, t, probes, scan, err)
}

// verifyAgainst is verifyTarget with the object's scan (and the error
// getting it) at hand.
func verifyAgainst(pid int, t *Target, probes []*probelist.Probe, scan *probelist.Index, err error) error {
	if errors.Is(err, elfscan.ErrNoHookSites) {
		// Every NOP placeholder still gets the full check (put the calls
		// back and scan); only flip sites of an object whose hooks a scan
		// cannot see fall back to the file check.
		var nops, flips []*probelist.Probe
		for _, p := range probes {
			if p.Placeholder == probelist.PlaceholderNop {
				nops = append(nops, p)
			} else {
				flips = append(flips, p)
			}
		}
		if len(nops) > 0 {
			if err := verifyNops(pid, t, nops); err != nil {
				return err
			}
		}
		return verifyBlind(pid, t, flips)
	}
	if err != nil {
		return fmt.Errorf("verifying %s against a scan of %s: %w", t.Origin, t.Object.Path, err)
	}
	var nops []*probelist.Probe
	for _, p := range probes {
		var sp *probelist.Probe
		if scan != nil {
			if sp, _, err = scan.At(uint64(p.Address)); err != nil {
				return fmt.Errorf("verifying %s: %w", t.Origin, err)
			}
		}
		if sp == nil {
			if p.Placeholder != probelist.PlaceholderNop {
				return unverified(t, p, "no hook call or jump starts there")
			}
			nops = append(nops, p)
			continue
		}
		if err := sameSite(p, sp); err != "" {
			return unverified(t, p, err)
		}
	}
	if len(nops) > 0 {
		return verifyNops(pid, t, nops)
	}
	return nil
}

// sameSite compares a listed probe with the scan's probe at its address;
// it returns what differs, or "".
func sameSite(p, sp *probelist.Probe) string {
	switch {
	case p.Encoding != sp.Encoding:
		return fmt.Sprintf("listed as %s, the scan finds %s", p.Encoding, sp.Encoding)
	case p.Offset != sp.Offset:
		return fmt.Sprintf("listed at file offset %s, the scan finds it at %s", p.Offset, sp.Offset)
	case p.Hook != sp.Hook:
		return fmt.Sprintf("listed as a call to %s, the scan finds %s", p.Hook, sp.Hook)
	case !bytes.Equal(p.Active, sp.Active):
		return fmt.Sprintf("listed active form %s, the scan finds %s", p.Active, sp.Active)
	}
	nop, err := probelist.InertForm(p.Encoding, p.Active, probelist.PlaceholderNop)
	if err != nil {
		return err.Error()
	}
	if !bytes.Equal(p.Inert, sp.Inert) && !bytes.Equal(p.Inert, nop) {
		return fmt.Sprintf("listed inert form %s is neither its flip form %s nor its NOP form %s", p.Inert, sp.Inert, nop)
	}
	return ""
}

// verifyNops checks NOP-placeholder sites, which a scan cannot see: the
// file must hold each listed NOP at the listed offset, and the file with
// the listed active forms put back must scan to exactly those sites.
func verifyNops(pid int, t *Target, nops []*probelist.Probe) error {
	found, bad, reason, err := restoredScan(pid, t.Object, nops, false)
	if err != nil {
		return fmt.Errorf("verifying %s: %w", t.Origin, err)
	}
	if bad != nil {
		return unverified(t, bad, reason)
	}
	for _, p := range nops {
		sp := found[uint64(p.Address)]
		if sp == nil {
			return unverified(t, p, "no hook call or jump starts there once its active form is put back")
		}
		if err := sameSite(p, sp); err != "" {
			return unverified(t, p, err)
		}
	}
	return nil
}

// restoredScan reads o's file (what its headers describe, D88), puts each
// NOP probe's active form back at its offset and scans the result: the
// sites a scan finds, by address. A probe whose NOP placeholder is not at
// its offset is returned as bad, with the reason; with skip, it is left
// as it is instead.
func restoredScan(pid int, o *procmaps.Object, nops []*probelist.Probe, skip bool) (map[uint64]*probelist.Probe, *probelist.Probe, string, error) {
	f, err := procmaps.Open(pid, o)
	if err != nil {
		return nil, nil, "", err
	}
	defer f.Close()
	data, err := elfsafe.ReadObject(f)
	if err != nil {
		return nil, nil, "", fmt.Errorf("%s: %w", o.Path, err)
	}
	for _, p := range nops {
		nop, err := probelist.InertForm(p.Encoding, p.Active, probelist.PlaceholderNop)
		off := int64(p.Offset)
		switch {
		case err == nil && bytes.Equal(p.Inert, nop) && off >= 0 && off+int64(len(nop)) <= int64(len(data)) && bytes.Equal(data[off:off+int64(len(nop))], nop):
			copy(data[off:], p.Active)
		case skip:
		case err != nil:
			return nil, p, err.Error(), nil
		default:
			return nil, p, "the file does not hold its NOP placeholder at the listed offset", nil
		}
	}
	list, _, err := elfscan.ScanBytes(data, o.Path, elfscan.Options{Placeholder: probelist.PlaceholderNop})
	if err != nil && !errors.Is(err, elfscan.ErrNoHookSites) {
		return nil, nil, "", fmt.Errorf("scanning %s with its listed sites restored: %w", o.Path, err)
	}
	found := map[uint64]*probelist.Probe{}
	if list != nil {
		for i := range list.Probes {
			found[uint64(list.Probes[i].Address)] = &list.Probes[i]
		}
	}
	return found, nil, "", nil
}

// verifyBlind is the weaker check for an object in which a scan sees no
// hook site at all: a stripped static binary, whose hook functions lost
// their symbols (the coldpatch-then-strip workflow). The file must hold a
// listed form at each listed offset, and a flip site's active form must be
// the one its inert form implies; an address inside an instruction whose
// bytes the list copied is not detectable here (docs/protocols.md).
func verifyBlind(pid int, t *Target, probes []*probelist.Probe) error {
	f, err := procmaps.Open(pid, t.Object)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range probes {
		b := make([]byte, len(p.Active))
		if _, err := f.ReadAt(b, int64(p.Offset)); err != nil {
			return unverified(t, p, "the listed offset lies outside the file")
		}
		if !bytes.Equal(b, p.Active) && !bytes.Equal(b, p.Inert) {
			return unverified(t, p, fmt.Sprintf("the file holds %s there, neither listed form", probelist.Bytes(b)))
		}
		if a, ok := probelist.ActiveFromFlip(p.Encoding, p.Inert); ok && !bytes.Equal(a, p.Active) {
			return unverified(t, p, fmt.Sprintf("listed active form %s, its inert form implies %s", p.Active, a))
		}
		flip, err := probelist.InertForm(p.Encoding, p.Active, probelist.PlaceholderFlip)
		if err != nil {
			return unverified(t, p, err.Error())
		}
		if !bytes.Equal(p.Inert, flip) {
			return unverified(t, p, fmt.Sprintf("listed inert form %s is not its flip form %s", p.Inert, flip))
		}
	}
	return nil
}

func unverified(t *Target, p *probelist.Probe, why string) error {
	return fmt.Errorf("%s: probe %d (%s %s) at %s: %s: %w (nothing was written)", t.Origin, p.ID, p.Kind, p.Function, p.Address, why, ErrUnverified)
}
