package dwarfargs

import (
	"debug/dwarf"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/go-delve/delve/pkg/dwarf/godwarf"
	"github.com/go-delve/delve/pkg/dwarf/loclist"

	"github.com/edgeprobe/edgeprobe/internal/elfsafe"
)

// Sentinel errors.
var (
	// ErrNoDWARF: the object carries no DWARF (built without -g, or stripped).
	ErrNoDWARF = errors.New("no DWARF debug information")
	// ErrNoFunction: DWARF describes no function starting at the address.
	ErrNoFunction = errors.New("no DWARF function at this address")
)

// Param is one formal parameter.
type Param struct {
	Name string
	Type *Type
	// Parts say where the value's bytes are at the function's entry; nil
	// when Missing says why it cannot be recorded.
	Parts   []Part
	Missing string
	// ByRef: C++ passes a pointer to a copy (the Part holds the pointer).
	ByRef bool
}

// Return is where the return value is when the function returns.
type Return struct {
	Type  *Type
	Parts []Part // LocInt 0 = rax, 1 = rdx; LocSSE 0 = xmm0, 1 = xmm1
	// InMemory: the value is in the caller's memory; rax holds its address.
	InMemory bool
	Missing  string
}

// Signature is what DWARF and the ABI say about one function's arguments.
type Signature struct {
	Name     string // source name (a clone's original)
	Symbol   string // ELF symbol at Addr ("foo.constprop.0" for a clone), "" if none
	Addr     uint64 // ELF virtual address of the first instruction
	External bool
	Params   []Param
	Variadic bool // "...": unnamed arguments are not described
	Ret      Return
	// Changed says why the compiler's calling convention for this function
	// is not the ABI's (a clone, dead arguments removed): then only what
	// DWARF itself locates at entry is recorded.
	Changed string
}

// Table answers signature queries for one ELF object.
type Table struct {
	d     *dwarf.Data
	tr    *typeReader
	sec   sections
	units []unit
	funcs map[uint64]funcRef
	syms  map[uint64]string
	sigs  map[uint64]*Signature
}

type funcRef struct {
	off  dwarf.Offset
	unit int
}

// Load indexes the functions of f's DWARF. Signatures are worked out on
// demand by Lookup.
func Load(f *elf.File) (t *Table, err error) {
	defer func() { // debug/dwarf and the location list readers can panic on malformed input
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("malformed DWARF: %v", r)
		}
	}()
	if f.Section(".debug_info") == nil {
		return nil, ErrNoDWARF
	}
	d, err := f.DWARF()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDWARF, err)
	}
	t = &Table{d: d, tr: &typeReader{d: d, cache: map[dwarf.Offset]*Type{}}, funcs: map[uint64]funcRef{},
		syms: map[uint64]string{}, sigs: map[uint64]*Signature{}}
	data := func(name string) []byte {
		if s := f.Section(name); s != nil {
			if b, err := s.Data(); err == nil {
				return b
			}
		}
		return nil
	}
	t.sec.info = data(".debug_info")
	t.sec.loclists = data(".debug_loclists")
	if b := data(".debug_loc"); len(b) > 0 {
		t.sec.loc2 = loclist.NewDwarf2Reader(b, 8)
	}
	if len(t.sec.loclists) >= 12 {
		t.sec.loc5 = loclist.NewDwarf5Reader(t.sec.loclists)
	}
	if b := data(".debug_addr"); len(b) >= 8 {
		t.sec.addr = godwarf.ParseAddr(b)
	}
	if syms, err := f.Symbols(); err == nil {
		for _, s := range syms {
			if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value != 0 {
				if old, ok := t.syms[s.Value]; !ok || strings.Contains(old, ".") {
					t.syms[s.Value] = s.Name
				}
			}
		}
	}
	r := d.Reader()
	cu := -1
	for {
		e, err := r.Next()
		if err != nil {
			return nil, fmt.Errorf("reading DWARF: %w", err)
		}
		if e == nil {
			break
		}
		switch e.Tag {
		case dwarf.TagCompileUnit, dwarf.TagPartialUnit:
			u := unit{version: t.sec.unitVersion(e.Offset)}
			u.base, _ = e.Val(dwarf.AttrLowpc).(uint64)
			if v, ok := e.Val(dwarf.AttrAddrBase).(int64); ok {
				u.addrBase = uint64(v)
			}
			if v, ok := e.Val(dwarf.AttrLoclistsBase).(int64); ok {
				u.loclistsBase = uint64(v)
			}
			p, _ := e.Val(dwarf.AttrProducer).(string)
			u.clang = strings.Contains(p, "clang")
			t.units = append(t.units, u)
			cu = len(t.units) - 1
		case dwarf.TagSubprogram:
			if lo, ok := e.Val(dwarf.AttrLowpc).(uint64); ok && lo != 0 && cu >= 0 {
				if _, dup := t.funcs[lo]; !dup {
					t.funcs[lo] = funcRef{e.Offset, cu}
				}
			}
		}
	}
	return t, nil
}

// Open loads the table of the ELF file at path.
func Open(path string) (*Table, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	f, err := elfsafe.NewFile(file)
	if err != nil {
		return nil, err
	}
	return Load(f)
}

// Addrs returns the addresses of every function DWARF gives code for, sorted.
func (t *Table) Addrs() []uint64 {
	out := make([]uint64, 0, len(t.funcs))
	for a := range t.funcs {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Lookup returns the signature of the function whose first instruction is
// at ELF address addr.
func (t *Table) Lookup(addr uint64) (sig *Signature, err error) {
	if s, ok := t.sigs[addr]; ok {
		return s, nil
	}
	ref, ok := t.funcs[addr]
	if !ok {
		return nil, fmt.Errorf("%#x: %w", addr, ErrNoFunction)
	}
	defer func() {
		if r := recover(); r != nil {
			sig, err = nil, fmt.Errorf("%#x: malformed DWARF: %v", addr, r)
		}
	}()
	sig, err = t.build(addr, ref)
	if err != nil {
		return nil, fmt.Errorf("%#x: %w", addr, err)
	}
	t.sigs[addr] = sig
	return sig, nil
}

// declared is a parameter as the source declares it, with the DIE that
// locates it in this instance of the function.
type declared struct {
	name string
	typ  *Type
	loc  *dwarf.Entry // the concrete DIE with the location, nil if none
}

func (t *Table) build(addr uint64, ref funcRef) (*Signature, error) {
	e, _, err := t.tr.entry(ref.off)
	if err != nil {
		return nil, err
	}
	u := &t.units[ref.unit]
	sig := &Signature{Addr: addr, Symbol: t.syms[addr]}
	// The attributes of a concrete out-of-line instance are spread over its
	// abstract origin and, in C++, the in-class declaration.
	chain := []*dwarf.Entry{e}
	for i := 0; i < 4; i++ {
		last := chain[len(chain)-1]
		next, ok := last.Val(dwarf.AttrAbstractOrigin).(dwarf.Offset)
		if !ok {
			next, ok = last.Val(dwarf.AttrSpecification).(dwarf.Offset)
		}
		if !ok {
			break
		}
		ne, _, err := t.tr.entry(next)
		if err != nil {
			return nil, err
		}
		chain = append(chain, ne)
	}
	var retType *Type = voidType
	prototyped := false
	for _, c := range chain {
		if sig.Name == "" {
			sig.Name, _ = c.Val(dwarf.AttrName).(string)
		}
		if ext, _ := c.Val(dwarf.AttrExternal).(bool); ext {
			sig.External = true
		}
		if p, _ := c.Val(dwarf.AttrPrototyped).(bool); p {
			prototyped = true
		}
		if _, ok := c.Val(dwarf.AttrType).(dwarf.Offset); ok && retType == voidType {
			if retType, err = t.tr.typeOf(c); err != nil {
				return nil, err
			}
		}
	}
	fbCFA := false
	if fb, ok := e.Val(dwarf.AttrFrameBase).([]byte); ok && len(fb) == 1 && fb[0] == 0x9c { // DW_OP_call_frame_cfa
		fbCFA = true
	}

	// The concrete parameters, in this instance's order.
	concrete, variadic, err := t.children(ref.off)
	if err != nil {
		return nil, err
	}
	// The declared parameters, in declaration order: the abstract origin's
	// when this is a concrete instance of one (a clone lists the ones it
	// kept first); else this DIE's own (a C++ definition outside its class
	// names its parameters, the in-class declaration does not).
	var decl []*declared
	byOrigin := map[dwarf.Offset]*declared{}
	if origin, ok := e.Val(dwarf.AttrAbstractOrigin).(dwarf.Offset); ok {
		ps, v, err := t.children(origin)
		if err != nil {
			return nil, err
		}
		variadic = variadic || v
		for _, p := range ps {
			d := &declared{}
			d.name, _ = p.Val(dwarf.AttrName).(string)
			if d.typ, err = t.tr.typeOf(p); err != nil {
				return nil, err
			}
			decl = append(decl, d)
			byOrigin[p.Offset] = d
		}
	}
	for _, c := range concrete {
		if o, ok := c.Val(dwarf.AttrAbstractOrigin).(dwarf.Offset); ok {
			if d := byOrigin[o]; d != nil {
				d.loc = c
				if n, ok := c.Val(dwarf.AttrName).(string); ok && d.name == "" {
					d.name = n
				}
				continue
			}
		}
		d := &declared{loc: c}
		d.name, _ = c.Val(dwarf.AttrName).(string)
		if _, ok := c.Val(dwarf.AttrType).(dwarf.Offset); ok {
			if d.typ, err = t.tr.typeOf(c); err != nil {
				return nil, err
			}
		} else if o, ok := c.Val(dwarf.AttrAbstractOrigin).(dwarf.Offset); ok {
			oe, _, err := t.tr.entry(o)
			if err != nil {
				return nil, err
			}
			if d.name == "" {
				d.name, _ = oe.Val(dwarf.AttrName).(string)
			}
			if d.typ, err = t.tr.typeOf(oe); err != nil {
				return nil, err
			}
		}
		decl = append(decl, d) // not in the declaration (or there is none): after the declared ones
	}
	sig.Variadic = variadic

	if sym := sig.Symbol; sym != "" && sym != sig.Name && strings.Contains(sym, ".") && strings.HasPrefix(sym, sig.Name+".") {
		sig.Changed = fmt.Sprintf("%s is a compiler-made clone of %s, with its own calling convention", sym, sig.Name)
	}

	// The ABI's assignment, then DWARF's own entry locations.
	var a assigner
	ret := Return{Type: retType}
	ret.Parts, ret.InMemory, ret.Missing = returnLoc(retType)
	if ret.InMemory {
		a.nextInt = 1 // the hidden pointer to the caller's return slot
	}
	dwarfAt := make([]where, len(decl))
	for i, d := range decl {
		p := Param{Name: d.name, Type: d.typ}
		if d.typ == nil {
			p.Type = &Type{Kind: KUnknown, Name: "?"}
		}
		p.ByRef = p.Type.ByRef
		if !prototyped && p.Type.Kind == KFloat && p.Type.Size == 4 {
			// An unprototyped (K&R) function gets its float arguments
			// promoted to double.
			p.Type = &Type{Kind: KFloat, Name: "double", Size: 8}
		}
		p.Parts, p.Missing = a.place(p.Type)
		sig.Params = append(sig.Params, p)
		if d.loc == nil {
			dwarfAt[i].why = "no DWARF location"
			continue
		}
		expr, err := t.sec.entryExpr(d.loc, u, addr)
		switch {
		case err != nil:
			dwarfAt[i].why = "DWARF location list unreadable: " + err.Error()
		case expr == nil:
			dwarfAt[i].why = "no DWARF location at entry"
		default:
			dwarfAt[i] = evalEntry(expr, p.Type.Size, fbCFA)
		}
	}
	if sig.Changed == "" {
		for i := range sig.Params {
			p := &sig.Params[i]
			if w := dwarfAt[i]; w.parts != nil && p.Missing == "" && !sameRegs(w.parts, p.Parts) {
				sig.Changed = fmt.Sprintf("DWARF puts %s in %s at entry, where the ABI puts it in %s: the compiler changed the calling convention",
					p.Name, partsString(w.parts), partsString(p.Parts))
				break
			}
		}
	}
	for i := range sig.Params {
		p := &sig.Params[i]
		w := dwarfAt[i]
		switch {
		case p.Missing != "":
		case sig.Changed != "":
			switch {
			case w.parts != nil:
				p.Parts = w.parts
			case w.onStk:
				p.Parts = []Part{{Kind: LocStack, Off: w.stack, Size: p.Type.Size}}
			default:
				p.Parts, p.Missing = nil, "not passed as the ABI says (see the function's note), and DWARF does not locate it at entry: "+w.why
			}
		case !sig.External && (decl[i].loc == nil || decl[i].loc.Val(dwarf.AttrLocation) == nil):
			// An internal function's argument that DWARF never locates is
			// unused, and clang removes unused arguments of internal
			// functions (dead argument elimination) without saying so.
			p.Parts, p.Missing = nil, "optimized out: an internal function's unused argument may not be passed at all"
		}
	}
	switch {
	case ret.Missing != "" || retType.Kind == KVoid:
	case sig.Changed != "":
		ret.Parts, ret.InMemory, ret.Missing = nil, false, "the compiler changed this function's calling convention; it may not return the value at all"
	case !sig.External && u.clang && e.Val(dwarf.AttrCallAllCalls) != nil:
		// clang's dead argument elimination also drops return values no
		// caller uses, and DWARF keeps the declared type.
		ret.Parts, ret.InMemory, ret.Missing = nil, false, "clang may drop an internal function's unused return value, and DWARF would not show it"
	}
	sig.Ret = ret
	return sig, nil
}

// children returns the formal parameters of the subprogram DIE at off, and
// whether it is variadic.
func (t *Table) children(off dwarf.Offset) (params []*dwarf.Entry, variadic bool, err error) {
	e, r, err := t.tr.entry(off)
	if err != nil {
		return nil, false, err
	}
	err = eachChild(r, e, func(c *dwarf.Entry) error {
		switch c.Tag {
		case dwarf.TagFormalParameter:
			params = append(params, c)
		case dwarf.TagUnspecifiedParameters:
			variadic = true
		}
		return nil
	})
	return params, variadic, err
}

func sameRegs(a, b []Part) bool {
	var x, y []Part
	for _, p := range a {
		if p.Size > 0 {
			x = append(x, Part{Kind: p.Kind, Reg: p.Reg})
		}
	}
	for _, p := range b {
		if p.Size > 0 {
			y = append(y, Part{Kind: p.Kind, Reg: p.Reg})
		}
	}
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if x[i] != y[i] {
			return false
		}
	}
	return true
}

func partsString(ps []Part) string {
	var s []string
	for _, p := range ps {
		if p.Size > 0 {
			s = append(s, p.String())
		}
	}
	return strings.Join(s, "+")
}
