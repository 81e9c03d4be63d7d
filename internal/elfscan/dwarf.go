package elfscan

import (
	"debug/dwarf"
	"path"
	"sort"
	"strconv"
	"strings"
)

// debugInfo is what the scan takes from DWARF: which compilation unit holds
// an address, whether any unit was built with LTO, and line tables, read
// once per unit and only for units that hold a site.
type debugInfo struct {
	d      *dwarf.Data
	units  []*dwarf.Entry
	ranges []cuRange // sorted by lo
	lto    bool
	lines  map[int][]lineRow
}

type cuRange struct {
	lo, hi uint64
	unit   int
}

type lineRow struct {
	addr uint64
	end  bool // end of a sequence: no line for addr and after
	loc  string
}

// readDebugInfo indexes the compilation units. DWARF only adds source
// locations and a reason to prefer the nop placeholder, so a file whose
// DWARF is malformed — even one that makes debug/dwarf panic — is scanned
// without it rather than refused.
func (o *object) readDebugInfo() (di *debugInfo) {
	defer func() {
		if recover() != nil {
			di = nil
		}
	}()
	d, err := o.f.DWARF()
	if err != nil {
		return nil
	}
	di = &debugInfo{d: d, lines: map[int][]lineRow{}}
	r := d.Reader()
	for {
		e, err := r.Next()
		if err != nil {
			return nil
		}
		if e == nil {
			break
		}
		if e.Tag != dwarf.TagCompileUnit && e.Tag != dwarf.TagPartialUnit {
			r.SkipChildren()
			continue
		}
		u := len(di.units)
		di.units = append(di.units, e)
		if p, _ := e.Val(dwarf.AttrProducer).(string); strings.Contains(p, "-flto") || strings.HasPrefix(p, "GNU GIMPLE") {
			di.lto = true
		}
		if rs, err := d.Ranges(e); err == nil {
			for _, rg := range rs {
				if rg[1] > rg[0] {
					di.ranges = append(di.ranges, cuRange{rg[0], rg[1], u})
				}
			}
		}
		r.SkipChildren()
	}
	sort.Slice(di.ranges, func(i, j int) bool { return di.ranges[i].lo < di.ranges[j].lo })
	return di
}

// unit returns the compilation unit holding addr, or -1.
func (di *debugInfo) unit(addr uint64) int {
	if di == nil {
		return -1
	}
	i := sort.Search(len(di.ranges), func(i int) bool { return di.ranges[i].lo > addr })
	for j := i - 1; j >= 0 && j >= i-16; j-- {
		if addr < di.ranges[j].hi {
			return di.ranges[j].unit
		}
	}
	return -1
}

// source returns "file:line" for addr, or "".
func (di *debugInfo) source(addr uint64) (loc string) {
	u := di.unit(addr)
	if u < 0 {
		return ""
	}
	rows, ok := di.lines[u]
	if !ok {
		rows = di.readLines(u)
		di.lines[u] = rows
	}
	i := sort.Search(len(rows), func(i int) bool { return rows[i].addr > addr })
	if i == 0 || rows[i-1].end {
		return ""
	}
	return rows[i-1].loc
}

func (di *debugInfo) readLines(u int) (rows []lineRow) {
	defer func() {
		if recover() != nil {
			rows = nil
		}
	}()
	lr, err := di.d.LineReader(di.units[u])
	if err != nil || lr == nil {
		return nil
	}
	var e dwarf.LineEntry
	for lr.Next(&e) == nil {
		row := lineRow{addr: e.Address, end: e.EndSequence}
		if !e.EndSequence && e.File != nil && e.Line > 0 {
			row.loc = path.Base(e.File.Name) + ":" + strconv.Itoa(e.Line)
		}
		rows = append(rows, row)
	}
	// At equal addresses an end of sequence sorts first, so a sequence
	// starting where another ends wins the lookup.
	sort.SliceStable(rows, func(i, j int) bool {
		if rows[i].addr != rows[j].addr {
			return rows[i].addr < rows[j].addr
		}
		return rows[i].end && !rows[j].end
	})
	return rows
}
