package report

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/elfsafe"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/procmaps"
)

// Symbolizer names run-time function addresses of one process.
type Symbolizer struct {
	objects []object
}

type object struct {
	procmaps.Object
	syms []sym // sorted by address
}

type sym struct {
	addr, size uint64 // ELF virtual address
	name       string
}

// NewSymbolizer reads the symbols of every object in objs; lists (from
// coldpatch) name functions of stripped objects, matched by build-id.
func NewSymbolizer(objs []procmaps.Object, open func(*procmaps.Object) (*os.File, error), lists []*probelist.List) *Symbolizer {
	s := &Symbolizer{}
	for i := range objs {
		o := object{Object: objs[i]}
		if f, err := open(&objs[i]); err == nil {
			o.syms = readSyms(f)
			f.Close()
		}
		for _, l := range lists {
			if l.Binary.BuildID != "" && l.Binary.BuildID == o.BuildID {
				o.syms = mergeListNames(o.syms, l)
			}
		}
		s.objects = append(s.objects, o)
	}
	return s
}

// ForPID symbolizes a live process.
func ForPID(pid int, lists []*probelist.List) (*Symbolizer, error) {
	objs, err := procmaps.Objects(pid)
	if err != nil {
		return nil, err
	}
	return NewSymbolizer(objs, func(o *procmaps.Object) (*os.File, error) { return procmaps.Open(pid, o) }, lists), nil
}

// ForMaps symbolizes an exited process from the maps copy its output file
// carries, reading the objects from disk.
func ForMaps(maps []byte, lists []*probelist.List) (*Symbolizer, error) {
	ms, err := procmaps.Parse(bytes.NewReader(maps))
	if err != nil {
		return nil, err
	}
	objs, err := procmaps.ObjectsOf(ms, func(m procmaps.Mapping) (*os.File, error) {
		if strings.HasPrefix(m.Path, "/memfd:") {
			// A runtime hotpatch loaded into the process (docs/injection.md)
			// lived in a memfd, which no longer exists: it has no probes to name.
			return nil, fmt.Errorf("%s: %w", m.Path, procmaps.ErrNotELF)
		}
		return openListed(m.Path, m.Inode)
	})
	if err != nil {
		return nil, err
	}
	return NewSymbolizer(objs, func(o *procmaps.Object) (*os.File, error) { return openListed(o.Path, o.Inode) }, lists), nil
}

// openListed opens a path an output file's maps copy lists: the file is
// the process's user's, and so are the paths and what they name now.
// Only a regular file is opened, and no other kind of file's open is run
// (procfs.OpenRegular: a FIFO put there waited forever, a link to a device
// had root's hotpatch open it, D88); one that is not the inode the process
// mapped is another program's and would name its functions wrongly.
func openListed(path string, inode uint64) (*os.File, error) {
	f, err := procfs.OpenRegular(path)
	if errors.Is(err, procfs.ErrNotRegular) {
		return nil, fmt.Errorf("%w: %w", err, procmaps.ErrNotELF)
	}
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil || st.Ino != inode {
		f.Close()
		return nil, fmt.Errorf("%s: not the file the process mapped (inode %d): replaced since: %w", path, inode, procmaps.ErrNotELF)
	}
	return f, nil
}

func readSyms(f *os.File) []sym {
	ef, err := elfsafe.NewFile(f)
	if err != nil {
		return nil
	}
	var out []sym
	seen := map[uint64]bool{}
	add := func(list []elf.Symbol) {
		for _, s := range list {
			if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Value == 0 || s.Section == elf.SHN_UNDEF || seen[s.Value] {
				continue
			}
			seen[s.Value] = true
			out = append(out, sym{s.Value, s.Size, s.Name})
		}
	}
	if l, err := ef.Symbols(); err == nil {
		add(l)
	}
	if l, err := ef.DynamicSymbols(); err == nil {
		add(l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].addr < out[j].addr })
	return out
}

func mergeListNames(syms []sym, l *probelist.List) []sym {
	have := map[uint64]bool{}
	for _, s := range syms {
		have[s.addr] = true
	}
	for _, p := range l.Probes {
		if p.Resolved && p.FunctionAddress != 0 && !have[uint64(p.FunctionAddress)] {
			have[uint64(p.FunctionAddress)] = true
			syms = append(syms, sym{addr: uint64(p.FunctionAddress), name: p.Function})
		}
	}
	sort.Slice(syms, func(i, j int) bool { return syms[i].addr < syms[j].addr })
	return syms
}

// Name returns the function at run-time address addr and the path of its
// object. With exact, only a symbol starting at addr counts (the hooks report
// function starts); otherwise the symbol containing addr (clang's _bare hook
// reports an address inside the function).
func (s *Symbolizer) Name(addr uint64, exact bool) (name, object string) {
	for i := range s.objects {
		o := &s.objects[i]
		if !o.InExec(addr, 1) {
			continue
		}
		v := addr - o.Bias
		j := sort.Search(len(o.syms), func(k int) bool { return o.syms[k].addr > v }) - 1
		if j >= 0 {
			sy := o.syms[j]
			if sy.addr == v || (!exact && (v < sy.addr+sy.size || sy.size == 0)) {
				return sy.name, o.Path
			}
		}
		return fmt.Sprintf("sub_%x", v), o.Path
	}
	return fmt.Sprintf("sub_%x", addr), ""
}
