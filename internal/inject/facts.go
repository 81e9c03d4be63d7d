package inject

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// factsName names objectFacts' cached form in the probe cache's keys:
// change it with the form.
const factsName = "inject.objectFacts/1"

// objectFacts is what Inspect needs of one object's file, in the file's own
// addresses (parseFacts): whether it names an interpreter, the wanted
// dynamic symbols it defines (each name once, the first definition), and
// its hook slots (the JUMP_SLOT and GLOB_DAT relocations of a hook, in the
// order of its relocation sections). It is what the probe cache keeps of
// an object for Inspect (readObject).
type objectFacts struct {
	interp bool
	defs   []factDef
	slots  []factSlot
}

type factDef struct {
	name  string
	value uint64
}

type factSlot struct {
	hook    uint8 // index in Hooks
	globDat bool  // R_X86_64_GLOB_DAT, else JUMP_SLOT
	off     uint64
}

// apply gives the facts as readObject returns them for an object mapped
// with bias: definitions and slots at run-time addresses.
func (x *objectFacts) apply(name string, bias uint64) (map[string]uint64, []Slot) {
	defs := make(map[string]uint64, len(x.defs))
	for _, d := range x.defs {
		defs[d.name] = d.value + bias
	}
	var slots []Slot
	for _, s := range x.slots {
		kind := "JUMP_SLOT"
		if s.globDat {
			kind = "GLOB_DAT"
		}
		slots = append(slots, Slot{Object: name, Hook: Hooks[s.hook], Reloc: kind, Addr: s.off + bias})
	}
	return defs, slots
}

// encode is the cached form: a flags byte (1: interp), the number of
// definitions, each a name (length byte, bytes) and a value, the number of
// slots, each a hook index, a kind (0 JUMP_SLOT, 1 GLOB_DAT) and an offset;
// counts are uvarints, values and offsets 8 bytes little-endian.
func (x *objectFacts) encode() []byte {
	b := make([]byte, 0, 16+len(x.defs)*24+len(x.slots)*10)
	flags := byte(0)
	if x.interp {
		flags = 1
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(len(x.defs)))
	for _, d := range x.defs {
		b = append(b, byte(len(d.name)))
		b = append(b, d.name...)
		b = binary.LittleEndian.AppendUint64(b, d.value)
	}
	b = binary.AppendUvarint(b, uint64(len(x.slots)))
	for _, s := range x.slots {
		kind := byte(0)
		if s.globDat {
			kind = 1
		}
		b = append(b, s.hook, kind)
		b = binary.LittleEndian.AppendUint64(b, s.off)
	}
	return b
}

var errFacts = errors.New("malformed object facts")

// decode reads encode's form into x, refusing anything encode cannot have
// written: unknown flags, a name that is not one Inspect wants or that
// comes twice, an unknown hook or kind, a count past the data, bytes left
// over. A cache entry is private and checksummed; this is what keeps a
// damaged one from being used all the same.
func (x *objectFacts) decode(b []byte) error {
	*x = objectFacts{}
	if len(b) < 1 || b[0] > 1 {
		return fmt.Errorf("%w: flags", errFacts)
	}
	x.interp = b[0] == 1
	b = b[1:]
	n, k := uvarint(b)
	if k <= 0 || n > uint64(len(wanted)) {
		return fmt.Errorf("%w: definition count", errFacts)
	}
	b = b[k:]
	seen := map[string]bool{}
	for i := uint64(0); i < n; i++ {
		if len(b) < 1 || len(b) < 1+int(b[0])+8 {
			return fmt.Errorf("%w: definition %d runs past the end", errFacts, i)
		}
		name := string(b[1 : 1+int(b[0])])
		if !wanted[name] || seen[name] {
			return fmt.Errorf("%w: definition %q", errFacts, name)
		}
		seen[name] = true
		x.defs = append(x.defs, factDef{name, binary.LittleEndian.Uint64(b[1+int(b[0]):])})
		b = b[1+int(b[0])+8:]
	}
	n, k = uvarint(b)
	if k <= 0 || n > uint64(len(b)-k)/10 {
		return fmt.Errorf("%w: slot count", errFacts)
	}
	b = b[k:]
	for i := uint64(0); i < n; i++ {
		if b[0] >= uint8(len(Hooks)) || b[1] > 1 {
			return fmt.Errorf("%w: slot %d", errFacts, i)
		}
		x.slots = append(x.slots, factSlot{hook: b[0], globDat: b[1] == 1, off: binary.LittleEndian.Uint64(b[2:])})
		b = b[10:]
	}
	if len(b) != 0 {
		return fmt.Errorf("%w: %d bytes left over", errFacts, len(b))
	}
	return nil
}

// uvarint is binary.Uvarint refusing (k = 0) any but the shortest form,
// the one encode writes.
func uvarint(b []byte) (uint64, int) {
	n, k := binary.Uvarint(b)
	if k <= 0 || k != len(binary.AppendUvarint(nil, n)) {
		return 0, 0
	}
	return n, k
}
