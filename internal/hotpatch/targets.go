package hotpatch

import (
	"debug/elf"
	"errors"
	"fmt"
	"strings"

	"github.com/edgeprobe/edgeprobe/internal/elfscan"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procmaps"
)

// ErrStale means a probe list does not describe any object the process maps.
var ErrStale = errors.New("stale probe list")

// Target is one instrumented object of the process with its probe list.
type Target struct {
	Object *procmaps.Object
	List   *probelist.List
	Origin string // the probe-list file, or "scan"
}

// LoadTargets finds the probe-bearing objects of pid. With probe-list files,
// each must match a mapped object (by build-id, else by path and size) and
// every site must lie in that object's executable mappings. Without them,
// every mapped object that may call a hook is scanned as coldpatch would.
func LoadTargets(pid int, probeFiles []string) ([]*Target, error) {
	objs, err := procmaps.Objects(pid)
	if err != nil {
		return nil, err
	}
	if len(probeFiles) > 0 {
		return matchLists(pid, objs, probeFiles)
	}
	var targets []*Target
	for i := range objs {
		o := &objs[i]
		list, err := scanObject(pid, o)
		if errors.Is(err, elfscan.ErrNoHookSites) || errors.Is(err, errNoHookSymbols) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("scanning %s: %w", o.Path, err)
		}
		targets = append(targets, &Target{Object: o, List: list, Origin: "scan"})
	}
	if len(targets) == 0 {
		return nil, fmt.Errorf("pid %d maps no object with hook sites (build with -finstrument-functions, or -pg -mfentry; nop-placeholder binaries need --probes)", pid)
	}
	return targets, nil
}

func matchLists(pid int, objs []procmaps.Object, files []string) ([]*Target, error) {
	var targets []*Target
	for _, file := range files {
		list, err := probelist.ReadFile(file)
		if err != nil {
			return nil, err
		}
		o, err := matchObject(objs, list)
		if err != nil {
			return nil, fmt.Errorf("%s: %w in pid %d: %v", file, ErrStale, pid, err)
		}
		for i := range list.Probes {
			p := &list.Probes[i]
			if !o.InExec(o.Runtime(uint64(p.Address)), uint64(len(p.Active))) {
				return nil, fmt.Errorf("%s: %w: probe %d at %s lies outside %s's executable mappings", file, ErrStale, p.ID, p.Address, o.Path)
			}
		}
		targets = append(targets, &Target{Object: o, List: list, Origin: file})
	}
	return targets, nil
}

func matchObject(objs []procmaps.Object, l *probelist.List) (*procmaps.Object, error) {
	// The build-id names the build, whatever was stripped from the file
	// since: a list made before `strip` applies to the stripped copy, whose
	// size differs but whose loaded code does not. Every site's bytes are
	// verified before any write, which is what catches a wrong match.
	for i := range objs {
		if o := &objs[i]; l.Binary.BuildID != "" && o.BuildID == l.Binary.BuildID {
			return o, nil
		}
	}
	if l.Binary.BuildID != "" {
		return nil, fmt.Errorf("no mapped object has build-id %s (%s)", l.Binary.BuildID, l.Binary.Path)
	}
	for i := range objs {
		if o := &objs[i]; o.BuildID == "" && o.Path == l.Binary.Path && o.Size == l.Binary.Size {
			return o, nil
		}
	}
	return nil, fmt.Errorf("no mapped object is %s (%d bytes, no build-id)", l.Binary.Path, l.Binary.Size)
}

var errNoHookSymbols = errors.New("no hook symbols")

// scanObject scans the file the process mapped (through map_files, so a
// binary replaced on disk since start is still the right one). Objects whose
// symbol tables name no hook are skipped without a full scan: that is every
// uninstrumented library, libc among them. An object with no symbol table at
// all (a stripped static executable) is scanned.
func scanObject(pid int, o *procmaps.Object) (*probelist.List, error) {
	f, err := procmaps.Open(pid, o)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if ef, err := elf.NewFile(f); err == nil && !mayCallHooks(ef) {
		return nil, errNoHookSymbols
	}
	list, _, err := elfscan.ScanReader(f, st.Size(), o.Path, elfscan.Options{Placeholder: probelist.PlaceholderFlip})
	return list, err
}

// mayCallHooks reports whether an object's symbols name a hook of any
// provider: __cyg_profile_func_* (-finstrument-functions), __fentry__
// (-pg -mfentry), or mcount/_mcount (-pg alone, whose calls the scan
// reports but never lists).
func mayCallHooks(f *elf.File) bool {
	syms, _ := f.DynamicSymbols()
	more, _ := f.Symbols()
	if len(syms) == 0 && len(more) == 0 {
		return true
	}
	for _, s := range append(syms, more...) {
		switch {
		case strings.HasPrefix(s.Name, "__cyg_profile_func_"),
			s.Name == probelist.HookFentry, s.Name == "mcount", s.Name == "_mcount":
			return true
		}
	}
	return false
}
