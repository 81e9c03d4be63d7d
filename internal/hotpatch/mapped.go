package hotpatch

import (
	"errors"
	"fmt"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/procmaps"
)

// MappedWithin is how long a check that a target is still mapped where the
// session found it (checkMapped) stands for the commands that follow it:
// a command starting later checks again. A one-shot hotpatch leaves about
// that long between its maps read and its writes; a session, without the
// check, left its whole life (D77).
const MappedWithin = time.Millisecond

// checkMapped makes sure every target in ts is still mapped where the
// session found it: each of its executable mappings (where its probe
// sites lie) still holds the same file (device and inode) at the same
// file offsets. A session outlives what it read at Open: a plugin
// unloaded and another object (or a new build of it) loaded at the same
// addresses would otherwise be written as if it were the old one,
// wherever its bytes happen to match the old list's forms (D77). It costs
// one PROCMAP_QUERY ioctl per mapping on the session's open maps file (a
// read of the maps text on a kernel without it), made at most once per
// MappedWithin per target: a session streaming toggles pays it once per
// millisecond, not per toggle.
//
// A process that ran exec or exited is left to the site reads, which say
// so: the maps file, opened with the targets (OpenContext), belongs to the
// old program, like the memory file.
func (s *Session) checkMapped(ts []*Target, now time.Time) error {
	within := s.mappedWithin
	if within == 0 {
		within = MappedWithin
	}
	if s.maps == nil {
		return nil // not opened with the targets: the process was going
	}
	if s.mappedAt == nil {
		s.mappedAt = map[*Target]time.Time{}
	}
	for _, t := range ts {
		if at, ok := s.mappedAt[t]; ok && within > 0 && now.Sub(at) < within {
			continue
		}
		if err := s.stillMapped(t); err != nil {
			delete(s.mappedAt, t)
			if errors.Is(err, procmaps.ErrNoProcess) {
				return nil
			}
			return err
		}
		s.mappedAt[t] = now
	}
	return nil
}

// fileID is a mapped file as the maps file's ioctl names it.
type fileID struct {
	dev   string
	inode uint64
}

// baseMaps records, right after the targets were read (OpenContext), the
// file each target's executable mapping holds as Covering reports it: the
// later checks compare like with like, so a kernel whose ioctl and text
// named a file differently (a filesystem whose inode numbers the two took
// from different places) could not make every command look stale. A
// mapping the ioctl cannot see then is checked against the text's name.
func (s *Session) baseMaps() {
	s.mapFiles = map[uint64]fileID{}
	for _, t := range s.targets {
		for _, m := range t.Object.Mappings {
			if !m.Exec() {
				continue
			}
			if now, ok, err := s.maps.Covering(m.Start); err == nil && ok {
				s.mapFiles[m.Start] = fileID{now.Dev, now.Inode}
			}
		}
	}
}

// stillMapped checks one target's executable mappings (checkMapped): the
// same file (as baseMaps found it) at the same offsets (as the text gave
// them: the mapping's page offset, which both report alike).
func (s *Session) stillMapped(t *Target) error {
	for _, m := range t.Object.Mappings {
		if !m.Exec() {
			continue
		}
		want, ok := s.mapFiles[m.Start]
		if !ok {
			want = fileID{m.Dev, m.Inode}
		}
		for addr := m.Start; addr < m.End; {
			now, ok, err := s.maps.Covering(addr)
			if err != nil {
				return err
			}
			var what string
			switch {
			case !ok:
				what = "nothing is mapped there now"
			case now.Dev != want.dev || now.Inode != want.inode:
				what = fmt.Sprintf("another file is mapped there now (device %s, inode %d)", now.Dev, now.Inode)
			case now.Offset+(addr-now.Start) != m.Offset+(addr-m.Start):
				what = fmt.Sprintf("the file is mapped there from another offset now (%#x)", now.Offset+(addr-now.Start))
			}
			if what != "" {
				return &unmappedError{fmt.Sprintf("%s is no longer mapped where the session found it (%#x: %s), so its probe list describes nothing there: %v (nothing was written)",
					t.Object.Path, addr, what, ErrStale)}
			}
			addr = now.End
		}
	}
	return nil
}

// unmappedError is stillMapped's refusal: a stale list (ErrStale) because
// its object is no longer mapped where the session found it (ErrUnmapped).
type unmappedError struct{ msg string }

func (e *unmappedError) Error() string { return e.msg }

func (e *unmappedError) Is(target error) bool { return target == ErrStale || target == ErrUnmapped }

// Unmapped returns the paths of the session's targets that are no longer
// mapped where the session found them (unloaded, or another file mapped
// there since: stillMapped), checked now: a capture says so in its output
// (an object unloaded during a trace, D80). Nil when the session has no
// maps file (the process was going when it opened).
func (s *Session) Unmapped() []string {
	if s.maps == nil {
		return nil
	}
	var out []string
	for _, t := range s.targets {
		if err := s.stillMapped(t); err != nil && errors.Is(err, ErrUnmapped) {
			out = append(out, t.Object.Path)
		}
	}
	return out
}
