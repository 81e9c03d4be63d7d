package elfscan

import (
	"debug/elf"
	"encoding/binary"
)

// MayHaveSites reports whether Scan could list a probe in the object in
// data, without decoding it. It answers false only when no byte of an
// executable segment begins one of probelist's site encodings, active or
// flip-inert (e8, e9, 3d or c3 and a rel32; ff, 3b or c3 then 15 or 25 and a
// disp32), whose target or GOT slot reaches a hook by the rules Scan applies
// to each instruction it decodes (object.target and object.slot). Every
// site Scan lists is such a byte sequence wherever decoding starts, so a
// false answer means Scan would find none.
//
// This is what lets hotpatch skip, without a full scan, the objects that
// define the hooks but never call them: glibc defines
// __cyg_profile_func_enter/exit and __fentry__, so its symbols name hooks,
// yet none of its code reaches them. A static program that links the
// runtime defines the hooks too, and calls them directly: it has such
// bytes, and is scanned.
func MayHaveSites(data []byte, path string) (bool, error) {
	o, err := load(data, path)
	if err != nil {
		return false, err
	}
	targets := map[uint64]bool{} // every address a rel32 branch may reach a hook at
	for a := range o.hookAddrs {
		targets[a] = true
	}
	for entry, slot := range o.plt {
		if o.slot(slot).found() {
			targets[entry] = true
		}
	}
	slots := len(targets) > 0 // a GOT slot can reach a hook only through a defined hook ...
	for _, r := range o.relocs {
		slots = slots || isHookName(r.sym) // ... or a relocation naming one
	}
	if !slots {
		return false, nil
	}
	for _, p := range o.loads {
		if p.Flags&elf.PF_X == 0 {
			continue
		}
		code := o.data[p.Off : p.Off+p.Filesz]
		for i := 0; i+5 <= len(code); i++ {
			addr := p.Vaddr + uint64(i)
			switch code[i] {
			case 0xe8, 0xe9, 0x3d, 0xc3:
				if targets[addr+5+uint64(int64(int32(binary.LittleEndian.Uint32(code[i+1:]))))] {
					return true, nil
				}
			}
			if i+6 <= len(code) && (code[i+1] == 0x15 || code[i+1] == 0x25) {
				switch code[i] {
				case 0xff, 0x3b, 0xc3:
					if o.slot(addr + 6 + uint64(int64(int32(binary.LittleEndian.Uint32(code[i+2:]))))).found() {
						return true, nil
					}
				}
			}
		}
	}
	return false, nil
}
