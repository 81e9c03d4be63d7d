package dwarfargs

import (
	"debug/dwarf"
	"encoding/binary"
	"fmt"

	"github.com/go-delve/delve/pkg/dwarf/godwarf"
	"github.com/go-delve/delve/pkg/dwarf/loclist"
	"github.com/go-delve/delve/pkg/dwarf/op"
)

// unit is what locating a parameter needs from its compilation unit.
type unit struct {
	version      int
	base         uint64 // DW_AT_low_pc: base of location list offsets
	addrBase     uint64
	loclistsBase uint64
	clang        bool
}

// sections are the raw DWARF sections location lists live in.
type sections struct {
	info, loclists []byte
	loc2           *loclist.Dwarf2Reader
	loc5           *loclist.Dwarf5Reader
	addr           *godwarf.DebugAddrSection
}

// unitVersion reads the version from the header of the unit whose first
// entry is at off (DWARF 5 headers are 12 bytes, DWARF 2-4 11 bytes; 32-bit
// DWARF, which is what gcc and clang write for x86-64).
func (s *sections) unitVersion(off dwarf.Offset) int {
	o := int(off)
	if o >= 12 && o <= len(s.info) && binary.LittleEndian.Uint16(s.info[o-12+4:]) == 5 {
		return 5
	}
	if o >= 11 && o <= len(s.info) {
		if v := int(binary.LittleEndian.Uint16(s.info[o-11+4:])); v >= 2 && v <= 4 {
			return v
		}
	}
	return 0
}

// entryExpr returns the location expression of a parameter that holds at
// pc, nil if its location does not cover pc or it has none.
func (s *sections) entryExpr(e *dwarf.Entry, u *unit, pc uint64) ([]byte, error) {
	f := e.AttrField(dwarf.AttrLocation)
	if f == nil {
		return nil, nil
	}
	switch v := f.Val.(type) {
	case []byte:
		return v, nil
	case int64:
		var (
			ent *loclist.Entry
			err error
		)
		switch {
		case u.version >= 5:
			off := v
			if f.Class == dwarf.ClassLocList { // DW_FORM_loclistx: an index into the offset table
				at := u.loclistsBase + uint64(v)*4
				if at+4 > uint64(len(s.loclists)) {
					return nil, fmt.Errorf("loclistx %d beyond .debug_loclists", v)
				}
				off = int64(u.loclistsBase) + int64(binary.LittleEndian.Uint32(s.loclists[at:]))
			}
			if s.loc5 == nil {
				return nil, fmt.Errorf("location list but no .debug_loclists")
			}
			ent, err = s.loc5.Find(int(off), 0, u.base, pc, s.addr.GetSubsection(u.addrBase))
		default:
			if s.loc2 == nil {
				return nil, fmt.Errorf("location list but no .debug_loc")
			}
			ent, err = s.loc2.Find(int(v), 0, u.base, pc, nil)
		}
		if err != nil || ent == nil {
			return nil, err
		}
		return ent.Instr, nil
	}
	return nil, fmt.Errorf("location of unexpected form %T", f.Val)
}

// DWARF x86-64 register numbers of the argument registers.
var dwarfIntArg = map[uint64]int{5: 0, 4: 1, 1: 2, 2: 3, 8: 4, 9: 5}

const dwarfXMM0 = 17

// where is a location expression evaluated at a function's first
// instruction: register parts, a stack argument offset, or why neither.
type where struct {
	parts []Part
	stack int64 // valid when onStack
	onStk bool
	why   string
}

// cfaProbe is a made-up CFA: an expression's address minus it is an offset
// into the caller's stack arguments.
const cfaProbe = 1 << 40

// evalEntry interprets expr at the entry instruction, where nothing has
// run yet: the stack pointer is CFA-8 and the frame base (when it is
// DW_OP_call_frame_cfa) the CFA; a frame base in rbp is not set up yet.
func evalEntry(expr []byte, size int64, cfaFrameBase bool) (w where) {
	defer func() {
		if recover() != nil {
			w = where{why: "DWARF location expression could not be read"}
		}
	}()
	regs := op.NewDwarfRegisters(0, nil, binary.LittleEndian, 16, 7, 6, 0)
	regs.CFA = cfaProbe
	regs.FrameBase = 1 << 50 // an rbp frame base is meaningless at entry
	if cfaFrameBase {
		regs.FrameBase = cfaProbe
	}
	regs.AddReg(7, op.DwarfRegisterFromUint64(cfaProbe-8))
	addr, pieces, err := op.ExecuteStackProgram(*regs, expr, 8, nil)
	if err != nil {
		return where{why: "DWARF describes it only by a value the caller computed (" + err.Error() + ")"}
	}
	if len(pieces) == 0 {
		off := addr - cfaProbe
		if off >= 0 && off < 1<<20 {
			return where{stack: off, onStk: true}
		}
		return where{why: "DWARF places it in the function's own frame, which does not exist yet at entry"}
	}
	at := int64(0)
	for _, p := range pieces {
		psize := int64(p.Size)
		if psize == 0 {
			psize = size - at
		}
		switch p.Kind {
		case op.RegPiece:
			if r, ok := dwarfIntArg[p.Val]; ok {
				w.parts = append(w.parts, Part{Kind: LocInt, Reg: r, At: at, Size: min(psize, 8)})
			} else if p.Val >= dwarfXMM0 && p.Val < dwarfXMM0+8 {
				w.parts = append(w.parts, Part{Kind: LocSSE, Reg: int(p.Val - dwarfXMM0), At: at, Size: min(psize, 8)})
			} else {
				return where{why: fmt.Sprintf("DWARF places it in DWARF register %d, not an argument register", p.Val)}
			}
		case op.ImmPiece:
			return where{why: "a constant the compiler propagated: not passed"}
		default:
			return where{why: "DWARF places part of it in memory"}
		}
		at += psize
	}
	return w
}
