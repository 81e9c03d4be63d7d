package coldpatch

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/edgeprobe/edgeprobe/internal/elfscan"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
)

// ErrSelfCheck means the patched image did not scan back to the same probes:
// a scanner bug, never written to disk.
var ErrSelfCheck = errors.New("self-check failed")

// Options control a run.
type Options struct {
	// Placeholder is probelist.PlaceholderFlip (default) or PlaceholderNop.
	Placeholder string
	// Output is where the cold binary goes; "" rewrites the input in place.
	Output string
	// DryRun scans and reports but writes nothing.
	DryRun bool
}

// Result is what a run did.
type Result struct {
	List    *probelist.List
	Report  *elfscan.Report
	Patched int  // sites turned from active to inert by this run
	Written bool // whether a file was written (false when nothing changed in place)
}

// Run scans the binary at path, makes every active hook site inert, and
// writes the result to opts.Output (or back to path).
func Run(path string, opts Options) (*Result, error) {
	if opts.Placeholder == "" {
		opts.Placeholder = probelist.PlaceholderFlip
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	// A symlink is followed: the file it names is read and, in place, is
	// the one rewritten (the link stays a link), as strip does; not one
	// another user planted in /tmp. procfs.Walk looks the path up one
	// component at a time from descriptors, and the file read, the
	// directory the temporary is made in and the name renamed over are the
	// ones it checked: a link swapped in meanwhile is not followed (D99).
	in, err := procfs.Walk(abs)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	abs = in.Path
	image, st, err := readChecked(in, abs)
	if err != nil {
		return nil, err
	}
	out, dst := abs, in
	if opts.Output != "" {
		if out, err = filepath.Abs(opts.Output); err != nil {
			return nil, err
		}
		// The output is replaced by a rename: through a link another user
		// planted at that name, root's rename would replace the file the
		// link names (any file root may write), so the same rule holds.
		if dst, err = procfs.Walk(out); err != nil {
			return nil, err
		}
		defer dst.Close()
		out = dst.Path
	}
	// Rewriting in place replaces the file (temp + rename): its other hard
	// links would keep the old, hot binary. Refuse and say so (decision
	// D21) rather than patch one name of several.
	var like os.FileInfo
	if out == abs {
		like = st
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Nlink > 1 && !opts.DryRun {
			return nil, fmt.Errorf("%s has %d links: rewriting it would leave the other %d with the old binary; patch a copy (-o) or remove the other links: %w",
				path, sys.Nlink, sys.Nlink-1, ErrHardLinks)
		}
	} else if dst.File >= 0 {
		ost, err := dst.Stat()
		if err != nil {
			return nil, err
		}
		if err := checkOutputOwner(dst, out, ost); err != nil {
			return nil, err
		}
		like = ost // an existing output keeps its owner and mode
	}
	list, report, err := elfscan.ScanReader(bytes.NewReader(image), int64(len(image)), abs, elfscan.Options{Placeholder: opts.Placeholder})
	if err != nil {
		return nil, err
	}
	list.Binary.Path = out // the list describes the cold binary
	res := &Result{List: list, Report: report}
	patched := append([]byte(nil), image...)
	for i := range list.Probes {
		p := &list.Probes[i]
		site := patched[p.Offset : uint64(p.Offset)+uint64(len(p.Active))]
		switch {
		case bytes.Equal(site, p.Inert):
		case bytes.Equal(site, p.Active):
			copy(site, p.Inert)
			res.Patched++
		default:
			return nil, fmt.Errorf("%s: probe %d at %s: bytes %x are neither active %s nor inert %s", path, p.ID, p.Address, site, p.Active, p.Inert)
		}
	}
	if err := selfCheck(list, patched, abs, opts.Placeholder); err != nil {
		return nil, fmt.Errorf("%s: %w", abs, err)
	}
	if opts.DryRun || (res.Patched == 0 && out == abs) {
		return res, nil
	}
	keepOwner := like != nil
	if like == nil {
		like = st // a new output file gets the input's mode, not its owner
	}
	if err := writeLike(dst, out, patched, like, keepOwner); err != nil {
		return nil, err
	}
	res.Written = true
	return res, nil
}

// selfCheck rescans the patched image. Every probe must be found again, now
// inert and with the same name and bytes, except nop-form call sites, which
// no scanner can tell from compiler padding; nothing new may appear.
func selfCheck(want *probelist.List, patched []byte, path, placeholder string) error {
	got, _, err := elfscan.ScanReader(bytes.NewReader(patched), int64(len(patched)), path, elfscan.Options{Placeholder: placeholder})
	if errors.Is(err, elfscan.ErrNoHookSites) && allUnrecognisable(want.Probes) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: rescanning the patched image: %v", ErrSelfCheck, err)
	}
	j := 0
	for i := range want.Probes {
		w := &want.Probes[i]
		if j < len(got.Probes) && got.Probes[j].Address == w.Address {
			g := &got.Probes[j]
			if g.Function != w.Function || g.Kind != w.Kind || g.Provider != w.Provider || !bytes.Equal(g.Active, w.Active) || !bytes.Equal(g.Inert, w.Inert) {
				return fmt.Errorf("%w: probe at %s scans back as %s %s %s %s/%s, want %s %s %s %s/%s", ErrSelfCheck, w.Address,
					g.Provider, g.Kind, g.Function, g.Active, g.Inert, w.Provider, w.Kind, w.Function, w.Active, w.Inert)
			}
			j++
			continue
		}
		if recognisable(w) {
			return fmt.Errorf("%w: probe at %s (%s %s) is gone after patching", ErrSelfCheck, w.Address, w.Kind, w.Function)
		}
	}
	if j != len(got.Probes) {
		return fmt.Errorf("%w: patching made a new site appear at %s", ErrSelfCheck, got.Probes[j].Address)
	}
	return nil
}

// recognisable reports whether a scan finds the probe's inert form again:
// flip forms keep the operand, and jumps keep it in their dead bytes.
func recognisable(p *probelist.Probe) bool {
	_, ok := probelist.ActiveFromFlip(p.Encoding, p.Inert)
	return ok
}

func allUnrecognisable(probes []probelist.Probe) bool {
	for i := range probes {
		if recognisable(&probes[i]) {
			return false
		}
	}
	return true
}
