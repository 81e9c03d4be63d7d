package hotpatch

import (
	"errors"
	"fmt"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
	"github.com/edgeprobe/edgeprobe/internal/elfscan"
	"github.com/edgeprobe/edgeprobe/internal/probecache"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/procmaps"
)

// ErrStale means a probe list does not describe any object the process maps.
var ErrStale = errors.New("stale probe list")

// Target is one instrumented object of the process with its probe list.
type Target struct {
	Object *procmaps.Object
	// List is the object's probe list in its compact form: probes are
	// decoded (and checked) as they are selected; Probe also checks they
	// lie in the object's executable mappings.
	List   *probelist.Index
	Origin string // the probe-list file, or "scan"
}

// Probe returns probe i of the target's list, checked against the process:
// its site lies wholly in one executable mapping of the object.
func (t *Target) Probe(i int) (*probelist.Probe, error) {
	p, err := t.List.Probe(i)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", t.Origin, err)
	}
	if !t.Object.InExec(t.Object.Runtime(uint64(p.Address)), uint64(len(p.Active))) {
		return nil, fmt.Errorf("%s: %w: probe %d at %s lies outside %s's executable mappings", t.Origin, ErrStale, p.ID, p.Address, t.Object.Path)
	}
	return p, nil
}

// LoadTargets finds the probe-bearing objects of pid. With probe-list files,
// each must match a mapped object (by build-id, else by path and size).
// Without them, every mapped object that may call a hook is scanned as
// coldpatch would. Lists and scans come from the per-user cache
// (internal/probecache) when it has them, so a call's cost does not grow
// with the size of the program.
func LoadTargets(pid int, probeFiles []string) ([]*Target, error) {
	objs, err := procmaps.Objects(pid)
	if err != nil {
		return nil, err
	}
	return loadTargets(pid, objs, probeFiles)
}

// loadTargets is LoadTargets on objs, the process's objects as read.
func loadTargets(pid int, objs []procmaps.Object, probeFiles []string) ([]*Target, error) {
	cache, _ := probecache.Default() // nil: nothing cached (the CLI says why)
	if len(probeFiles) > 0 {
		return matchLists(pid, objs, probeFiles, cache)
	}
	var targets []*Target
	for i := range objs {
		o := &objs[i]
		list, err := cache.Scan(pid, o)
		if errors.Is(err, elfscan.ErrNoHookSites) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("scanning %s: %w", o.Path, err)
		}
		targets = append(targets, &Target{Object: o, List: list, Origin: "scan"})
	}
	if len(targets) == 0 {
		if err := procfs.Zombie(pid); err != nil {
			return nil, err // its maps are empty because it has exited
		}
		return nil, fmt.Errorf("pid %d maps no object with hook sites (build with -finstrument-functions, or -pg -mfentry; nop-placeholder binaries need --probes)", pid)
	}
	return targets, nil
}

// ScanObject is the scan of one mapped object (cached): every hook site it
// holds, whatever probe lists say. Safety checks compare a site with it.
func ScanObject(pid int, o *procmaps.Object) (*probelist.Index, error) {
	cache, _ := probecache.Default()
	return cache.Scan(pid, o)
}

func matchLists(pid int, objs []procmaps.Object, files []string, cache *probecache.Cache) ([]*Target, error) {
	var targets []*Target
	for _, file := range files {
		list, err := cache.List(file)
		if err != nil {
			return nil, err
		}
		o, err := matchObject(objs, list.Binary())
		if err == nil && list.Binary().BuildID == "" {
			err = sameBuild(pid, o, list, cache)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w in pid %d: %v", file, ErrStale, pid, err)
		}
		targets = append(targets, &Target{Object: o, List: list, Origin: file})
	}
	return targets, nil
}

func matchObject(objs []procmaps.Object, b probelist.Binary) (*procmaps.Object, error) {
	// The build-id names the build, whatever was stripped from the file
	// since: a list made before `strip` applies to the stripped copy, whose
	// size differs but whose loaded code does not. Every site's bytes are
	// verified before any write, which catches most wrong matches; a match
	// by path and size is compared with the object's scan too (sameBuild).
	for i := range objs {
		if o := &objs[i]; b.BuildID != "" && o.BuildID == b.BuildID {
			return o, nil
		}
	}
	if b.BuildID != "" {
		return nil, fmt.Errorf("no mapped object has build-id %s (%s)", b.BuildID, b.Path)
	}
	for i := range objs {
		if o := &objs[i]; o.BuildID == "" && o.Path == b.Path && o.Size == b.Size {
			return o, nil
		}
	}
	return nil, fmt.Errorf("no mapped object is %s (%d bytes, no build-id)", b.Path, b.Size)
}

// sameBuild checks a list matched by path and size alone (the object has
// no build-id) against the scan of the object the process maps: another
// build of the same size put at the path since the list was made (a
// rebuild that moved functions) has hook sites whose bytes are the same
// call at the same addresses, so the byte check before a write passes,
// and `--enable work` turned on leaf's sites (review7; docs/probe-list.md).
// Every list probe the scan finds must be of the same function and kind.
// NOP placeholders, which a scan does not see, are compared with a scan of
// the object's file with their active forms put back where the file holds
// their NOPs (a site without its NOP is left to the byte check).
func sameBuild(pid int, o *procmaps.Object, list *probelist.Index, cache *probecache.Cache) error {
	scan, err := cache.Scan(pid, o)
	if err != nil && !errors.Is(err, elfscan.ErrNoHookSites) {
		return fmt.Errorf("scanning %s to compare with the list: %w", o.Path, err)
	}
	var nops []*probelist.Probe
	for i := 0; i < list.Len(); i++ {
		p, err := list.Probe(i)
		if err != nil {
			return err
		}
		var s *probelist.Probe
		if scan != nil {
			if s, _, err = scan.At(uint64(p.Address)); err != nil {
				return err
			}
		}
		if s == nil {
			if p.Placeholder == probelist.PlaceholderNop {
				nops = append(nops, p)
			}
			continue
		}
		if err := sameFunction(o, p, s); err != nil {
			return err
		}
	}
	if len(nops) == 0 {
		return nil
	}
	// Only the NOPs the file holds are put back: a site that lost its NOP
	// is refused by the byte check of the sites selected, as before.
	found, _, _, err := restoredScan(pid, o, nops, true)
	if err != nil {
		return fmt.Errorf("scanning %s to compare with the list: %w", o.Path, err)
	}
	for _, p := range nops {
		if s := found[uint64(p.Address)]; s != nil {
			if err := sameFunction(o, p, s); err != nil {
				return err
			}
		}
	}
	return nil
}

// sameFunction: the list's probe p and the scan's site s at its address
// must be of the same function and kind.
func sameFunction(o *procmaps.Object, p, s *probelist.Probe) error {
	if s.Function != p.Function || s.FunctionAddress != p.FunctionAddress || s.Kind != p.Kind {
		return fmt.Errorf("%s is not the build the list describes (no build-id tells them apart): its site at %s is %s's %s, the list's probe %d there is %s's %s",
			calltrace.Printable(o.Path), p.Address, calltrace.Printable(s.Function), s.Kind, p.ID, calltrace.Printable(p.Function), p.Kind)
	}
	return nil
}
