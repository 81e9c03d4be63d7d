package elfscan

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/edgeprobe/edgeprobe/internal/elfnote"
	"github.com/edgeprobe/edgeprobe/internal/elfsafe"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/x86dec"
)

// The hooks -finstrument-functions calls; enter_bare is clang's
// -finstrument-function-entry-bare, which passes no arguments. -pg -mfentry
// calls __fentry__ first thing in every function; -pg alone calls mcount
// (glibc also names it _mcount) after the prologue, which has no inert form
// edgeprobe supports, so its references are only reported.
const (
	hookEnter     = probelist.HookCygEnter
	hookExit      = probelist.HookCygExit
	hookEnterBare = probelist.HookCygEnterBare
	hookFentry    = probelist.HookFentry
	hookMcount    = "mcount"
	hookMcountAlt = "_mcount"
)

// providerMcount is the pseudo-provider of mcount references: found and
// reported, never probes.
const providerMcount = "mcount"

func isHookName(name string) bool { return hookProvider(name) != "" }

// hookProvider returns the provider whose sites reach the named hook:
// probelist.ProviderCyg, probelist.ProviderFentry, providerMcount, or "".
func hookProvider(name string) string {
	switch name {
	case hookMcount, hookMcountAlt:
		return providerMcount
	}
	return probelist.ProviderOf(name)
}

// object is the parsed ELF file with the indexes the scan needs.
type object struct {
	path  string
	data  []byte
	f     *elf.File
	loads []elf.ProgHeader // PT_LOAD, file-backed part only counts for bytes

	symtab, dynsym []elf.Symbol
	names          map[uint64]symName // best name of each function start
	funcStarts     map[uint64]bool    // symbols and FDE starts: what rdi may name
	hookAddrs      map[uint64][]string
	plt            map[uint64]uint64 // PLT entry address -> GOT slot it jumps through
	pltSecs        []*elf.Section
	relocs         map[uint64]reloc // GOT slot -> its dynamic relocation
	fdes           []fdeRange
	ehErr          error
	problems       []DecodeError
	scratch        []insn // instruction buffer shared by successive analyses
}

type symName struct {
	name string
	rank int // lower is better
}

type reloc struct {
	typ     elf.R_X86_64
	sym     string
	defined bool // the symbol is defined in this object
	value   uint64
	addend  int64
	dup     bool // more than one relocation for the slot: trust none
}

func (o *object) fail(kind error, where, format string, args ...any) error {
	return &Error{Path: o.path, Where: where, Kind: kind, Detail: fmt.Sprintf(format, args...)}
}

func atOffset(off uint64) string { return fmt.Sprintf("offset %#x", off) }

// load checks the header and the extent of every section and segment, then
// builds the indexes. Checking extents first lets the rest slice o.data freely.
func load(data []byte, path string) (*object, error) {
	o := &object{path: path, data: data}
	if len(data) < 4 || string(data[:4]) != elf.ELFMAG {
		return nil, o.fail(ErrNotELF, atOffset(0), "no ELF magic")
	}
	if len(data) < 64 {
		return nil, o.fail(ErrTruncated, atOffset(0), "%d bytes is shorter than an ELF64 header", len(data))
	}
	if elf.Class(data[elf.EI_CLASS]) != elf.ELFCLASS64 {
		return nil, o.fail(ErrNotX86_64, atOffset(elf.EI_CLASS), "class %v", elf.Class(data[elf.EI_CLASS]))
	}
	if elf.Data(data[elf.EI_DATA]) != elf.ELFDATA2LSB {
		return nil, o.fail(ErrNotX86_64, atOffset(elf.EI_DATA), "byte order %v", elf.Data(data[elf.EI_DATA]))
	}
	if m := elf.Machine(binary.LittleEndian.Uint16(data[18:])); m != elf.EM_X86_64 {
		return nil, o.fail(ErrNotX86_64, atOffset(18), "machine %v", m)
	}
	f, err := elfsafe.NewFile(bytes.NewReader(data))
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, o.fail(ErrTruncated, "", "%v", err)
		}
		return nil, o.fail(ErrMalformed, "", "%v", err)
	}
	o.f = f
	switch f.Type {
	case elf.ET_EXEC, elf.ET_DYN:
	default:
		return nil, o.fail(ErrUnsupported, atOffset(16), "object type %v: only executables and shared libraries have final addresses", f.Type)
	}
	size := uint64(len(data))
	for _, s := range f.Sections {
		if s.Type != elf.SHT_NOBITS && s.Type != elf.SHT_NULL && (s.Offset > size || s.FileSize > size-s.Offset) {
			return nil, o.fail(ErrTruncated, atOffset(s.Offset), "section %s (%#x bytes) runs past the end of the %d-byte file", s.Name, s.FileSize, size)
		}
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD {
			continue
		}
		if p.Off > size || p.Filesz > size-p.Off || p.Vaddr+p.Memsz < p.Vaddr || p.Filesz > p.Memsz {
			return nil, o.fail(ErrTruncated, atOffset(p.Off), "PT_LOAD segment at %#x (%#x bytes) runs past the end of the %d-byte file or is inconsistent", p.Vaddr, p.Filesz, size)
		}
		o.loads = append(o.loads, p.ProgHeader)
	}
	if len(f.Sections) < 2 {
		return nil, o.fail(ErrUnsupported, "", "no section headers: the PLT, GOT relocations and .eh_frame cannot be found")
	}
	if err := o.index(); err != nil {
		return nil, err
	}
	return o, nil
}

// sectionData returns a section's bytes from the file; compressed and
// NOBITS sections have none the scan could use.
func (o *object) sectionData(s *elf.Section) []byte {
	if s == nil || s.Type == elf.SHT_NOBITS || s.Flags&elf.SHF_COMPRESSED != 0 {
		return nil
	}
	return o.data[s.Offset : s.Offset+s.FileSize]
}

// bytesAt returns the file bytes at address addr, at most n, from the
// PT_LOAD segment holding addr; exec also requires an executable segment.
func (o *object) bytesAt(addr uint64, n uint64, exec bool) ([]byte, uint64, bool) {
	for _, p := range o.loads {
		if addr < p.Vaddr || addr-p.Vaddr >= p.Filesz || exec && p.Flags&elf.PF_X == 0 {
			continue
		}
		off := p.Off + (addr - p.Vaddr)
		avail := p.Filesz - (addr - p.Vaddr)
		if n > avail {
			n = avail
		}
		return o.data[off : off+n], off, true
	}
	return nil, 0, false
}

func (o *object) read64(addr uint64) (uint64, bool) {
	b, _, ok := o.bytesAt(addr, 8, false)
	if !ok || len(b) < 8 {
		return 0, false
	}
	return binary.LittleEndian.Uint64(b), true
}

func (o *object) index() error {
	o.names = map[uint64]symName{}
	o.funcStarts = map[uint64]bool{}
	o.hookAddrs = map[uint64][]string{}
	var err error
	if o.symtab, err = o.f.Symbols(); err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return o.fail(ErrMalformed, "", ".symtab: %v", err)
	}
	if o.dynsym, err = o.f.DynamicSymbols(); err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return o.fail(ErrMalformed, "", ".dynsym: %v", err)
	}
	for tab, syms := range [][]elf.Symbol{o.symtab, o.dynsym} {
		for _, s := range syms {
			if !o.definedFunc(s) {
				continue
			}
			o.funcStarts[s.Value] = true
			r := nameRank(s, tab)
			if cur, ok := o.names[s.Value]; !ok || r < cur.rank || r == cur.rank && s.Name < cur.name {
				o.names[s.Value] = symName{s.Name, r}
			}
			if isHookName(s.Name) && elf.ST_TYPE(s.Info) == elf.STT_FUNC && !contains(o.hookAddrs[s.Value], s.Name) {
				o.hookAddrs[s.Value] = append(o.hookAddrs[s.Value], s.Name)
			}
		}
	}
	for _, names := range o.hookAddrs {
		sort.Strings(names)
	}
	if eh := o.f.Section(".eh_frame"); eh != nil && eh.Type != elf.SHT_NOBITS {
		var b ehBases
		if t := o.f.Section(".text"); t != nil {
			b.text = t.Addr
		}
		if g := o.f.Section(".got"); g != nil {
			b.data = g.Addr
		}
		o.fdes, o.ehErr = parseEhFrame(o.sectionData(eh), eh.Addr, b)
		if o.ehErr != nil {
			o.fdes = nil
		}
		for _, d := range o.fdes {
			o.funcStarts[d.start] = true
		}
	}
	if err := o.readRelocs(); err != nil {
		return err
	}
	o.readPLT()
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// definedFunc reports whether s is a function defined in this object.
func (o *object) definedFunc(s elf.Symbol) bool {
	t := elf.ST_TYPE(s.Info)
	return (t == elf.STT_FUNC || t == elf.STT_GNU_IFUNC) && s.Section != elf.SHN_UNDEF &&
		s.Section < elf.SHN_LORESERVE && s.Value != 0 && s.Name != ""
}

// nameRank orders the aliases of one address: .symtab before .dynsym, global
// before weak before local, fewer leading underscores, then shorter names.
func nameRank(s elf.Symbol, tab int) int {
	bind := map[elf.SymBind]int{elf.STB_GLOBAL: 0, elf.STB_WEAK: 1}[elf.ST_BIND(s.Info)]
	if b := elf.ST_BIND(s.Info); b != elf.STB_GLOBAL && b != elf.STB_WEAK {
		bind = 2
	}
	under := len(s.Name) - len(strings.TrimLeft(s.Name, "_"))
	if under > 9 {
		under = 9
	}
	n := len(s.Name)
	if n > 9999 {
		n = 9999
	}
	return tab*1_000_000 + bind*100_000 + under*10_000 + n
}

// nameOf names a function start: its best symbol, or sub_<hex>.
func (o *object) nameOf(addr uint64) string {
	if n, ok := o.names[addr]; ok {
		return n.name
	}
	return fmt.Sprintf("sub_%x", addr)
}

// readRelocs indexes the dynamic relocations by the slot they fill. A slot's
// symbol, not its address, says which function the GOT entry reaches, and
// it survives stripping because the dynamic linker needs it.
func (o *object) readRelocs() error {
	o.relocs = map[uint64]reloc{}
	for _, s := range o.f.Sections {
		if s.Type != elf.SHT_RELA {
			continue
		}
		var syms []elf.Symbol
		if int(s.Link) < len(o.f.Sections) && s.Link != 0 {
			switch o.f.Sections[s.Link].Type {
			case elf.SHT_DYNSYM:
				syms = o.dynsym
			case elf.SHT_SYMTAB:
				syms = o.symtab
			}
		}
		data := o.sectionData(s)
		for i := 0; i+24 <= len(data); i += 24 {
			off := binary.LittleEndian.Uint64(data[i:])
			info := binary.LittleEndian.Uint64(data[i+8:])
			r := reloc{typ: elf.R_X86_64(info & 0xffffffff), addend: int64(binary.LittleEndian.Uint64(data[i+16:]))}
			switch r.typ {
			case elf.R_X86_64_GLOB_DAT, elf.R_X86_64_JMP_SLOT, elf.R_X86_64_64, elf.R_X86_64_RELATIVE, elf.R_X86_64_IRELATIVE:
			default:
				continue
			}
			if si := info >> 32; si != 0 {
				if si > uint64(len(syms)) {
					return o.fail(ErrMalformed, atOffset(s.Offset+uint64(i)), "relocation in %s names symbol %d of %d", s.Name, si, len(syms))
				}
				sym := syms[si-1]
				r.sym = sym.Name
				r.defined = sym.Section != elf.SHN_UNDEF && sym.Section < elf.SHN_LORESERVE && sym.Value != 0
				r.value = sym.Value
			}
			if prev, ok := o.relocs[off]; ok {
				prev.dup = true
				o.relocs[off] = prev
				continue
			}
			o.relocs[off] = r
		}
	}
	return nil
}

// readPLT decodes the PLT stubs to learn which GOT slot each entry jumps
// through. Calls target the entry's first byte, which is the endbr64 in front
// of the jump in IBT-enabled PLTs (.plt.sec and .plt.got with -z ibtplt).
func (o *object) readPLT() {
	o.plt = map[uint64]uint64{}
	for _, s := range o.f.Sections {
		switch s.Name {
		case ".plt", ".plt.sec", ".plt.got", ".iplt":
		default:
			continue
		}
		if s.Type != elf.SHT_PROGBITS || s.Flags&elf.SHF_EXECINSTR == 0 {
			continue
		}
		o.pltSecs = append(o.pltSecs, s)
		code := o.sectionData(s)
		endbr := uint64(0)
		haveEndbr := false
		for pc := 0; pc < len(code); {
			addr := s.Addr + uint64(pc)
			in, err := x86dec.Decode(code[pc:])
			if err != nil {
				o.problems = append(o.problems, DecodeError{Function: s.Name, Address: addr, Err: err.Error()})
				break
			}
			if in.Kind == x86dec.KindEndbr64 {
				endbr, haveEndbr = addr, true
			} else {
				if slot, ok := ripTarget(in, addr); ok && isJmp(in) {
					entry := addr
					if haveEndbr && endbr+4 == addr {
						entry = endbr
					}
					o.plt[entry] = slot
				}
				haveEndbr = false
			}
			pc += in.Len
		}
	}
}

func (o *object) inPLT(addr uint64) bool {
	for _, s := range o.pltSecs {
		if addr >= s.Addr && addr-s.Addr < s.Size {
			return true
		}
	}
	return false
}

// hookRef is what a call target or GOT slot reaches.
type hookRef struct {
	hook      string
	direct    bool     // the hook is defined in this object and reached by address
	hookAddr  uint64   // its address when direct
	ambiguous []string // several hook names share the address: entry and exit cannot be told apart
}

func (h hookRef) found() bool { return h.hook != "" || len(h.ambiguous) > 0 }

// provider is the provider of the hook h reaches; "" when ambiguous.
func (h hookRef) provider() string { return hookProvider(h.hook) }

// definedHook looks addr up among the hooks this object defines. glibc's
// mcount and _mcount are one function: names of one provider that makes no
// entry/exit distinction are one hook.
func (o *object) definedHook(addr uint64) hookRef {
	names := o.hookAddrs[addr]
	switch {
	case len(names) == 0:
		return hookRef{}
	case len(names) == 1:
		return hookRef{hook: names[0], direct: true, hookAddr: addr}
	}
	same := true
	for _, n := range names {
		same = same && hookProvider(n) == providerMcount
	}
	if same {
		return hookRef{hook: names[0], direct: true, hookAddr: addr}
	}
	return hookRef{ambiguous: names, hookAddr: addr}
}

// target says whether a direct call or jump to addr reaches a hook.
func (o *object) target(addr uint64) hookRef {
	if h := o.definedHook(addr); h.found() {
		return h
	}
	if slot, ok := o.plt[addr]; ok {
		h := o.slot(slot)
		h.direct = false
		return h
	}
	return hookRef{}
}

// slot says whether the GOT slot at addr holds a hook's address.
func (o *object) slot(addr uint64) hookRef {
	if r, ok := o.relocs[addr]; ok {
		if r.dup {
			return hookRef{}
		}
		switch r.typ {
		case elf.R_X86_64_GLOB_DAT, elf.R_X86_64_JMP_SLOT, elf.R_X86_64_64:
			if isHookName(r.sym) && r.addend == 0 {
				return hookRef{hook: r.sym}
			}
			return hookRef{}
		case elf.R_X86_64_RELATIVE:
			h := o.definedHook(uint64(r.addend))
			h.direct = false
			return h
		}
		return hookRef{}
	}
	if o.f.Type == elf.ET_EXEC {
		// A static executable's GOT holds final addresses, with no relocation.
		if v, ok := o.read64(addr); ok {
			h := o.definedHook(v)
			h.direct = false
			return h
		}
	}
	return hookRef{}
}

// slotValue is the address a GOT slot will hold at run time, when the file
// says so without depending on another object.
func (o *object) slotValue(addr uint64) (uint64, bool) {
	if r, ok := o.relocs[addr]; ok {
		if r.dup {
			return 0, false
		}
		switch r.typ {
		case elf.R_X86_64_GLOB_DAT, elf.R_X86_64_JMP_SLOT, elf.R_X86_64_64:
			if r.defined {
				return r.value + uint64(r.addend), true
			}
		case elf.R_X86_64_RELATIVE:
			return uint64(r.addend), true
		}
		return 0, false
	}
	if o.f.Type == elf.ET_EXEC {
		return o.read64(addr)
	}
	return 0, false
}

// buildID returns the GNU build-id note as hex, or "".
func (o *object) buildID() string {
	for _, s := range o.f.Sections {
		if s.Type != elf.SHT_NOTE {
			continue
		}
		if id := elfnote.BuildID(o.sectionData(s), binary.LittleEndian); id != "" {
			return id
		}
	}
	return ""
}
