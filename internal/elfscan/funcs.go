package elfscan

import (
	"debug/elf"
	"sort"
	"strings"
)

// function is one decoding unit: a symbol's or an FDE's code range.
type function struct {
	start, end uint64
	name       string
}

// functions lists the code ranges to decode: .symtab functions, then
// .dynsym functions at addresses .symtab did not cover, then FDEs starting
// outside every range so far. The union matters for stripped shared
// libraries, whose .dynsym names only the exported functions while the
// static and hidden ones, which have hook sites too, are known only to
// .eh_frame. source lists the tables that contributed.
func (o *object) functions() (fns []function, source string) {
	byStart := map[uint64]*function{}
	var sources []string
	add := func(start, end uint64, name, src string) bool {
		if end <= start || o.inPLT(start) {
			return false
		}
		if _, _, ok := o.bytesAt(start, 1, true); !ok {
			return false
		}
		if f, ok := byStart[start]; ok {
			if end > f.end {
				f.end = end
			}
			return false
		}
		byStart[start] = &function{start: start, end: end, name: name}
		if len(sources) == 0 || sources[len(sources)-1] != src {
			sources = append(sources, src)
		}
		return true
	}
	for tab, syms := range [][]elf.Symbol{o.symtab, o.dynsym} {
		src := []string{"symtab", "dynsym"}[tab]
		for _, s := range syms {
			if o.definedFunc(s) && s.Size > 0 && s.Value+s.Size > s.Value {
				add(s.Value, s.Value+s.Size, o.nameOf(s.Value), src)
			}
		}
	}
	covered := sortedFunctions(byStart)
	for _, d := range o.fdes {
		if !inside(covered, d.start) {
			add(d.start, d.end, o.nameOf(d.start), "eh_frame")
		}
	}
	return sortedFunctions(byStart), strings.Join(dedupe(sources), "+")
}

func sortedFunctions(m map[uint64]*function) []function {
	out := make([]function, 0, len(m))
	for _, f := range m {
		out = append(out, *f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start < out[j].start })
	return out
}

// inside reports whether addr lies within one of the sorted ranges.
func inside(fns []function, addr uint64) bool {
	i := sort.Search(len(fns), func(i int) bool { return fns[i].start > addr })
	for j := i - 1; j >= 0 && j >= i-8; j-- { // ranges may nest; a few back is plenty
		if addr < fns[j].end {
			return true
		}
	}
	return false
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
