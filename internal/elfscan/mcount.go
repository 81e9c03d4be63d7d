package elfscan

import (
	"debug/elf"
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
)

// mcountLocSection is where gcc's -mrecord-mcount lists the address of every
// __fentry__ (or mcount) call it emitted, one 8-byte address per call. The
// kernel's ftrace reads it; here it is an independent witness of the sites.
const mcountLocSection = "__mcount_loc"

// parseMcountLoc reads the table's addresses. In a PIE or shared library each
// entry carries an R_X86_64_RELATIVE relocation whose addend is the address
// (the loader writes base+addend there); relative gives the addend for the
// entry at a table address, when there is one. Data whose length is not a
// multiple of 8 is refused.
func parseMcountLoc(data []byte, addr uint64, relative func(uint64) (uint64, bool)) ([]uint64, error) {
	if len(data)%8 != 0 {
		return nil, fmt.Errorf("%s is %d bytes, not a whole number of 8-byte addresses", mcountLocSection, len(data))
	}
	out := make([]uint64, 0, len(data)/8)
	for i := 0; i+8 <= len(data); i += 8 {
		v := binary.LittleEndian.Uint64(data[i:])
		if relative != nil {
			if r, ok := relative(addr + uint64(i)); ok {
				v = r
			}
		}
		out = append(out, v)
	}
	return out, nil
}

// checkMcountLoc compares the __mcount_loc table, if the object has one,
// with the list's fentry probes.
func (o *object) checkMcountLoc(l *probelist.List) *McountLocCheck {
	sec := o.f.Section(mcountLocSection)
	if sec == nil {
		return nil
	}
	c := &McountLocCheck{}
	if sec.Type != elf.SHT_PROGBITS || sec.Flags&elf.SHF_COMPRESSED != 0 {
		c.Err = fmt.Sprintf("%s is %v with flags %v: no table to read", mcountLocSection, sec.Type, sec.Flags)
		return c
	}
	entries, err := parseMcountLoc(o.sectionData(sec), sec.Addr, func(at uint64) (uint64, bool) {
		r, ok := o.relocs[at]
		if !ok || r.dup || r.typ != elf.R_X86_64_RELATIVE {
			return 0, false
		}
		return uint64(r.addend), true
	})
	if err != nil {
		c.Err = err.Error()
		return c
	}
	c.Entries = len(entries)
	probes := map[uint64]bool{}
	for i := range l.Probes {
		if p := &l.Probes[i]; p.Provider == probelist.ProviderFentry {
			probes[uint64(p.Address)] = false
		}
	}
	for _, a := range entries {
		seen, ok := probes[a]
		switch {
		case a == 0:
			c.Zero++
		case !ok:
			c.NotSites = append(c.NotSites, a)
		case !seen:
			probes[a] = true
			c.Matched++
		}
	}
	for a, seen := range probes {
		if !seen {
			c.Unlisted = append(c.Unlisted, a)
		}
	}
	sort.Slice(c.NotSites, func(i, j int) bool { return c.NotSites[i] < c.NotSites[j] })
	sort.Slice(c.Unlisted, func(i, j int) bool { return c.Unlisted[i] < c.Unlisted[j] })
	return c
}
