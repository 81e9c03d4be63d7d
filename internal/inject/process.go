package inject

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/edgeprobe/edgeprobe/internal/elfsafe"
	"github.com/edgeprobe/edgeprobe/internal/probecache"
	"github.com/edgeprobe/edgeprobe/internal/procmaps"
	"github.com/edgeprobe/edgeprobe/internal/ptrace"
)

// Hooks are the symbols the runtime defines and the compilers call, in the
// order of the loader's value table (HookIndex).
var Hooks = []string{"__cyg_profile_func_enter", "__cyg_profile_func_exit", "__cyg_profile_func_enter_bare", "__fentry__"}

func hookIndex(name string) int {
	for i, h := range Hooks {
		if h == name {
			return i
		}
	}
	return -1
}

// Slot states.
const (
	SlotRouted  = "routed"  // points to the runtime (or is unbound and will bind to a preloaded one)
	SlotGlibc   = "glibc"   // points to libc's hook (the empty one, or __fentry__'s mcount)
	SlotLazy    = "lazy"    // not yet bound, and its first call would bind it to libc's hook
	SlotForeign = "foreign" // bound (or will bind) to hooks the program defines itself: left alone
	SlotUnset   = "unset"   // zero: an undefined weak reference
)

// Slot is one GOT entry through which an object calls a hook.
type Slot struct {
	Object string `json:"object"`
	Hook   string `json:"hook"`
	Reloc  string `json:"reloc"` // JUMP_SLOT (PLT) or GLOB_DAT (-fno-plt, address taken)
	Addr   uint64 `json:"addr"`
	Value  uint64 `json:"value"`
	State  string `json:"state"`
	Target string `json:"target,omitempty"` // the object Value lies in
	prot   int    // the page's protection, for the loader's mprotect
}

// Process is what Inspect found; nothing in the process was changed.
type Process struct {
	Pid int
	// UID (the real uid) and Seccomp (the Seccomp: field, 0: none) are
	// read from /proc/PID/status by Preflight, which every load runs
	// first: only a load needs them, and that file costs about half a
	// millisecond to read on a VM with many possible CPUs (D71).
	UID        int
	Seccomp    int
	statusRead bool
	// SeccompThreads counts the threads under seccomp: a filter installed
	// without TSYNC applies to its own thread only, and the main thread's
	// status says nothing of it (D56). Preflight counts them (reading every
	// thread's status), not Inspect: only a load needs them.
	SeccompThreads int
	threadsCounted bool
	Static         bool
	Objects        []procmaps.Object
	Libc           *procmaps.Object
	Loader         *procmaps.Object // ld.so
	Runtime        *procmaps.Object // an object that defines every hook (the edgeprobe runtime)
	OwnHooks       []string         // other objects (not libc) that define a hook themselves
	Slots          []Slot
	funcs          map[string]uint64 // libc (and libdl/libpthread) entry points by name
	// runtimeHooks are Runtime's hooks in Hooks order.
	runtimeHooks [4]uint64
	maps         []procmaps.Mapping
}

// NeedRouting returns the slots still bound to glibc or not bound yet.
func (p *Process) NeedRouting() []Slot {
	var out []Slot
	for _, s := range p.Slots {
		if s.State == SlotGlibc || s.State == SlotLazy {
			out = append(out, s)
		}
	}
	return out
}

// Foreign returns the slots bound to the program's own hooks.
func (p *Process) Foreign() []Slot {
	var out []Slot
	for _, s := range p.Slots {
		if s.State == SlotForeign {
			out = append(out, s)
		}
	}
	return out
}

// Inspect reads pid's maps and mapped objects, and every hook slot with its
// current value. It attaches to nothing. What only a load needs of the
// process's status (UID, Seccomp) is read by Preflight.
func Inspect(pid int) (*Process, error) {
	p := &Process{Pid: pid, funcs: map[string]uint64{}}
	// One read of the maps for the objects, the main executable and the
	// slots' page protections.
	var err error
	if p.maps, err = procmaps.Read(pid); err != nil {
		return nil, err
	}
	if p.Objects, err = procmaps.ObjectsOf(p.maps, procmaps.Opener(pid)); err != nil {
		return nil, err
	}
	mem, err := ptrace.OpenMem(pid)
	if err != nil {
		return nil, err
	}
	defer mem.Close()
	mainObj, _ := procmaps.MainOf(pid, p.Objects)
	type info struct {
		defs  map[string]uint64 // defined dynamic symbols (run-time addresses)
		slots []Slot
	}
	infos := make([]info, len(p.Objects))
	for i := range p.Objects {
		o := &p.Objects[i]
		base := path.Base(o.Path)
		switch {
		case strings.HasPrefix(base, "ld-linux") || strings.HasPrefix(base, "ld-musl") || strings.HasPrefix(base, "ld64.so"):
			p.Loader = o
		case strings.HasPrefix(base, "libc.so") || strings.HasPrefix(base, "libc-2."):
			p.Libc = o
		}
		defs, slots, interp, err := readObject(pid, o)
		if err != nil {
			return nil, err
		}
		infos[i] = info{defs, slots}
		if mainObj != nil && o.Inode == mainObj.Inode && o.Dev == mainObj.Dev && !interp && o.Type == elf.ET_EXEC {
			p.Static = true
		}
		if mainObj != nil && o.Inode == mainObj.Inode && o.Dev == mainObj.Dev && !interp && o.Type == elf.ET_DYN && p.Loader == nil {
			p.Static = true // static-pie
		}
	}
	if p.Loader != nil {
		p.Static = false
	}
	// Entry points: libc first, then libdl and libpthread (glibc before 2.34).
	order := []int{}
	for i := range p.Objects {
		if &p.Objects[i] == p.Libc {
			order = append([]int{i}, order...)
		} else {
			order = append(order, i)
		}
	}
	for _, i := range order {
		base := path.Base(p.Objects[i].Path)
		if &p.Objects[i] != p.Libc && !strings.HasPrefix(base, "libdl") && !strings.HasPrefix(base, "libpthread") {
			continue
		}
		for _, name := range libcFuncs {
			if _, ok := p.funcs[name]; !ok {
				if a, ok := infos[i].defs[name]; ok {
					p.funcs[name] = a
				}
			}
		}
	}
	ownerOf := map[string]*procmaps.Object{} // the program's own definition of each hook
	for i := range p.Objects {
		o := &p.Objects[i]
		if o == p.Libc || o == p.Loader {
			continue
		}
		all := true
		for _, h := range Hooks {
			if _, ok := infos[i].defs[h]; !ok {
				all = false
			}
		}
		if all {
			p.Runtime = o
			for k, h := range Hooks {
				p.runtimeHooks[k] = infos[i].defs[h]
			}
			continue
		}
		own := false
		for _, h := range Hooks {
			if _, ok := infos[i].defs[h]; ok {
				own = true
				if ownerOf[h] == nil {
					ownerOf[h] = o
				}
			}
		}
		if own {
			p.OwnHooks = append(p.OwnHooks, o.Path)
		}
	}
	// A runtime in the global scope (preloaded or linked, not loaded by us
	// from a memfd) is what a lazy slot binds to on its first call.
	inScope := p.Runtime != nil && !strings.HasPrefix(path.Base(p.Runtime.Path), "memfd:")
	for i := range p.Objects {
		o := &p.Objects[i]
		if o == p.Runtime || o == p.Libc || o == p.Loader {
			continue
		}
		for _, s := range infos[i].slots {
			var b [8]byte
			if err := mem.ReadMem(s.Addr, b[:]); err != nil {
				return nil, fmt.Errorf("read hook slot of %s at %#x: %w", o.Path, s.Addr, err)
			}
			s.Value = binary.LittleEndian.Uint64(b[:])
			s.prot = p.protOf(s.Addr)
			owner := p.objectAt(s.Value)
			if owner != nil {
				s.Target = owner.Path
			}
			_, selfDefines := infos[i].defs[s.Hook]
			switch {
			case s.Value == 0:
				s.State = SlotUnset
			case owner != nil && owner == p.Runtime:
				s.State = SlotRouted
			case owner != nil && owner == p.Libc:
				s.State = SlotGlibc
			case owner == o && !selfDefines:
				// Not bound yet: the first call binds it to the first
				// definition in the global scope. The program's own hooks or
				// a preloaded runtime come before libc; else it is glibc's.
				switch {
				case ownerOf[s.Hook] != nil:
					s.State, s.Target = SlotForeign, ownerOf[s.Hook].Path
				case inScope:
					s.State, s.Target = SlotRouted, p.Runtime.Path
				default:
					s.State = SlotLazy
				}
			default:
				s.State = SlotForeign
			}
			p.Slots = append(p.Slots, s)
		}
	}
	return p, nil
}

// libcFuncs are the target's functions the loader calls.
var libcFuncs = []string{"mmap", "munmap", "mprotect", "syscall", "pthread_create", "pthread_self", "pthread_detach", "dlopen", "dlsym", "dlerror"}

// objectAt returns the object with an executable mapping holding addr.
func (p *Process) objectAt(addr uint64) *procmaps.Object {
	for i := range p.Objects {
		if p.Objects[i].InExec(addr, 1) {
			return &p.Objects[i]
		}
	}
	return nil
}

// protOf returns the PROT_* bits of the mapping holding addr, or -1 when it
// is writable already (the loader then stores without mprotect).
func (p *Process) protOf(addr uint64) int {
	for _, m := range p.maps {
		if addr >= m.Start && addr < m.End {
			prot := 0
			if m.Perms[0] == 'r' {
				prot |= 1
			}
			if m.Perms[1] == 'w' {
				return -1
			}
			if m.Perms[2] == 'x' {
				prot |= 4
			}
			return prot
		}
	}
	return 1
}

// readObject reads an object's defined dynamic symbols (the ones Inspect
// needs: hooks and libc entry points), its hook slots from the dynamic
// relocations, and whether it names an interpreter: from the probe cache
// when it has them for this file (probecache.Facts, keyed by build-id and
// file identity), else parsed from the file and cached. A --enable
// inspects every object on every call, and a program's .dynsym and
// .rela.dyn grow with its functions: 1 MB read for 20,000 exported
// functions, for the few entries Inspect keeps (D72).
func readObject(pid int, o *procmaps.Object) (map[string]uint64, []Slot, bool, error) {
	cache, _ := probecache.Default() // nil: parse every time
	return readObjectWith(cache, pid, o)
}

func readObjectWith(cache *probecache.Cache, pid int, o *procmaps.Object) (map[string]uint64, []Slot, bool, error) {
	var fa objectFacts
	parsed := false
	err := cache.Facts(pid, o, factsName, func(f *os.File) ([]byte, error) {
		parsed = true
		x, err := parseFacts(f, o.Path)
		if err != nil {
			return nil, err
		}
		return x.encode(), nil
	}, fa.decode)
	if err != nil {
		if !parsed {
			err = fmt.Errorf("%s: %w", o.Path, err)
		}
		return nil, nil, false, err
	}
	defs, slots := fa.apply(o.Path, o.Bias)
	return defs, slots, fa.interp, nil
}

// parseObject is readObject on the object's file contents: every value
// it reads comes from the file, so a hand-edited file must give an error or
// fewer slots, never a panic (FuzzParseObject). Its results go through the
// cached form (objectFacts' encode and decode), so the tests that compare
// them with debug/elf's also check that form.
func parseObject(r io.ReaderAt, name string, bias uint64) (map[string]uint64, []Slot, bool, error) {
	x, err := parseFacts(r, name)
	if err != nil {
		return nil, nil, false, err
	}
	var fa objectFacts
	if err := fa.decode(x.encode()); err != nil {
		return nil, nil, false, fmt.Errorf("%s: the cached form does not decode: %v", name, err)
	}
	defs, slots := fa.apply(name, bias)
	return defs, slots, fa.interp, nil
}

// parseFacts parses an object's file into the facts parseObject returns,
// in the file's own addresses.
//
// It reads the dynamic symbols raw rather than through
// elf.File.DynamicSymbols, which makes a string (and decodes the symbol
// versions) of each of libc's thousands of symbols on every hotpatch
// --enable: here a symbol's name is compared in place, and only the few
// wanted ones become strings. Wherever DynamicSymbols reads a 64-bit
// little-endian file, the results are the same (TestParseObjectLikeDebugElf,
// FuzzParseObject); it refuses what DynamicSymbols refuses but for bad
// symbol-version tables, which the slots do not depend on.
func parseFacts(r io.ReaderAt, name string) (*objectFacts, error) {
	ef, err := elfsafe.NewFile(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %v: %w", name, err, procmaps.ErrNotELF)
	}
	x := &objectFacts{}
	for _, prog := range ef.Progs {
		if prog.Type == elf.PT_INTERP {
			x.interp = true
		}
	}
	if ef.Class != elf.ELFCLASS64 || ef.Data != elf.ELFDATA2LSB {
		return x, nil // no x86-64 process maps it
	}
	syms, strs, ok := dynsyms(ef)
	if !ok {
		return x, nil // no .dynsym: a static program
	}
	nsyms := len(syms) / symSize // the null symbol included
	seen := map[string]bool{}
	le := binary.LittleEndian
	for k := 1; k < nsyms; k++ {
		sym := syms[k*symSize : (k+1)*symSize]
		info, shndx, value := sym[4], elf.SectionIndex(le.Uint16(sym[6:])), le.Uint64(sym[8:])
		if shndx == elf.SHN_UNDEF || value == 0 || elf.ST_TYPE(info) != elf.STT_FUNC && elf.ST_TYPE(info) != elf.STT_GNU_IFUNC {
			continue
		}
		n := symName(strs, le.Uint32(sym))
		if len(n) == 0 || !wanted[string(n)] {
			continue
		}
		if !seen[string(n)] {
			seen[string(n)] = true
			x.defs = append(x.defs, factDef{string(n), value})
		}
	}
	var buf []byte
	for _, sec := range ef.Sections {
		if sec.Type != elf.SHT_RELA {
			continue
		}
		// A section is used whole or not at all (as sec.Data() would
		// give it), read a chunk at a time: a PIE's .rela.dyn holds a
		// RELATIVE entry per function pointer, 480 KB for 20,000
		// functions, which need not be copied into fresh memory on every
		// --enable (D67).
		var ok bool
		var found []factSlot
		found, buf, ok = relaSlots(sec, buf, func(roff, rinfo uint64) (factSlot, bool) {
			typ := elf.R_X86_64(elf.R_TYPE64(rinfo))
			if typ != elf.R_X86_64_JMP_SLOT && typ != elf.R_X86_64_GLOB_DAT {
				return factSlot{}, false
			}
			si := uint64(elf.R_SYM64(rinfo))
			if si == 0 || si >= uint64(nsyms) {
				return factSlot{}, false
			}
			h := hookIndex(string(symName(strs, le.Uint32(syms[si*symSize:]))))
			if h < 0 {
				return factSlot{}, false
			}
			return factSlot{hook: uint8(h), globDat: typ == elf.R_X86_64_GLOB_DAT, off: roff}, true
		})
		if ok {
			x.slots = append(x.slots, found...)
		}
	}
	return x, nil
}

// relaChunk is how much of a relocation section is read at a time: whole
// entries.
const relaChunk = 24 * 2048

// relaSlots calls slot for each whole 24-byte JUMP_SLOT or GLOB_DAT entry
// of sec (offset, info) and returns the slots it made; ok is false, and the slots are not to be
// used, where sec.Data() would fail (the section runs past the file). buf
// is a buffer to reuse, returned grown.
func relaSlots(sec *elf.Section, buf []byte, slot func(roff, rinfo uint64) (factSlot, bool)) ([]factSlot, []byte, bool) {
	var out []factSlot
	visit := func(data []byte) {
		for off := 0; off+24 <= len(data); off += 24 {
			info := binary.LittleEndian.Uint64(data[off+8:])
			if t := elf.R_X86_64(elf.R_TYPE64(info)); t != elf.R_X86_64_JMP_SLOT && t != elf.R_X86_64_GLOB_DAT {
				continue // most entries: no call per entry for them
			}
			if s, ok := slot(binary.LittleEndian.Uint64(data[off:]), info); ok {
				out = append(out, s)
			}
		}
	}
	if sec.Flags&elf.SHF_COMPRESSED != 0 || sec.Size > 1<<40 {
		data, err := sec.Data()
		if err != nil {
			return nil, buf, false
		}
		visit(data)
		return out, buf, true
	}
	if cap(buf) < relaChunk {
		buf = make([]byte, relaChunk)
	}
	for off := uint64(0); off < sec.Size; {
		n := min(sec.Size-off, relaChunk)
		if _, err := sec.ReadAt(buf[:n], int64(off)); err != nil {
			return nil, buf, false
		}
		visit(buf[:n])
		off += n
	}
	return out, buf, true
}

// symSize is an ELF64 symbol's size.
const symSize = 24

// wanted are the dynamic symbols Inspect keeps: the hooks and libc's entry
// points the loader calls.
var wanted = func() map[string]bool {
	m := map[string]bool{}
	for _, n := range append(append([]string(nil), Hooks...), libcFuncs...) {
		m[n] = true
	}
	return m
}()

// dynsyms returns the raw .dynsym (null symbol included) and its string
// table, refusing what elf.File.DynamicSymbols refuses: no such section, an
// unreadable or empty one, a size not a multiple of a symbol, a string
// table link out of range or unreadable.
func dynsyms(ef *elf.File) (syms, strs []byte, ok bool) {
	sec := ef.SectionByType(elf.SHT_DYNSYM)
	if sec == nil {
		return nil, nil, false
	}
	syms, err := sec.Data()
	if err != nil || len(syms) == 0 || len(syms)%symSize != 0 {
		return nil, nil, false
	}
	if sec.Link <= 0 || sec.Link >= uint32(len(ef.Sections)) {
		return nil, nil, false
	}
	if strs, err = ef.Sections[sec.Link].Data(); err != nil {
		return nil, nil, false
	}
	return syms, strs, true
}

// symName is the NUL-terminated name at off in strs, empty when it does
// not lie (terminated) inside strs, as debug/elf reads it.
func symName(strs []byte, off uint32) []byte {
	if uint64(off) >= uint64(len(strs)) {
		return nil
	}
	n := bytes.IndexByte(strs[off:], 0)
	if n < 0 {
		return nil
	}
	return strs[off : int(off)+n]
}
