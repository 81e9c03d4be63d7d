package elfscan

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// fdeRange is the code range [start, end) one FDE describes.
type fdeRange struct{ start, end uint64 }

// ehBases are the base addresses of the DW_EH_PE_textrel and _datarel pointer
// encodings; zero means the base is unknown and such a pointer is an error.
type ehBases struct{ text, data uint64 }

// DW_EH_PE_* pointer encodings (LSB Core, "DWARF Extensions").
const (
	pePtr     = 0x00
	peULEB128 = 0x01
	peUData2  = 0x02
	peUData4  = 0x03
	peUData8  = 0x04
	peSLEB128 = 0x09
	peSData2  = 0x0a
	peSData4  = 0x0b
	peSData8  = 0x0c
	pePCRel   = 0x10
	peTextRel = 0x20
	peDataRel = 0x30
	peOmit    = 0xff
)

type cie struct {
	fdeEnc byte
	aug    bool // augmentation data ('z') follows the FDE's address range
}

// ehReader reads one .eh_frame section; every read is bounds-checked, since
// the section comes from the file being scanned.
type ehReader struct {
	data  []byte
	addr  uint64 // address of data[0]
	bases ehBases
	cies  map[int]*cie
}

var errEhShort = errors.New("runs past the end of its entry")

// parseEhFrame returns the ranges of the FDEs in an .eh_frame section loaded
// at addr. Stripped objects keep .eh_frame for unwinding, so it is the last
// place that still says where functions start and end.
func parseEhFrame(data []byte, addr uint64, bases ehBases) ([]fdeRange, error) {
	r := &ehReader{data: data, addr: addr, bases: bases, cies: map[int]*cie{}}
	var out []fdeRange
	for off := 0; off < len(data); {
		start := off
		length, p, err := r.u32(off, len(data))
		if err != nil {
			return nil, fmt.Errorf(".eh_frame offset %#x: length %w", start, err)
		}
		if length == 0 {
			break // terminator
		}
		var size uint64 = uint64(length)
		if length == 0xffffffff {
			l64, q, err := r.u64(p, len(data))
			if err != nil {
				return nil, fmt.Errorf(".eh_frame offset %#x: 64-bit length %w", start, err)
			}
			size, p = l64, q
		}
		if size > uint64(len(data)-p) || size < 4 {
			return nil, fmt.Errorf(".eh_frame offset %#x: entry length %#x runs past the section end", start, size)
		}
		end := p + int(size)
		id, body, _ := r.u32(p, end)
		if id == 0 {
			if _, err := r.cie(start); err != nil {
				return nil, err
			}
		} else {
			f, err := r.fde(start, p, id, body, end)
			if err != nil {
				return nil, err
			}
			if f.end > f.start {
				out = append(out, f)
			}
		}
		off = end
	}
	return out, nil
}

// cie parses (once) the CIE whose length field is at off.
func (r *ehReader) cie(off int) (*cie, error) {
	if c, ok := r.cies[off]; ok {
		return c, nil
	}
	bad := func(format string, args ...any) (*cie, error) {
		return nil, fmt.Errorf(".eh_frame CIE at offset %#x: %s", off, fmt.Sprintf(format, args...))
	}
	length, p, err := r.u32(off, len(r.data))
	if err != nil || length == 0 {
		return bad("bad length")
	}
	size := uint64(length)
	if length == 0xffffffff {
		if size, p, err = r.u64(p, len(r.data)); err != nil {
			return bad("64-bit length %v", err)
		}
	}
	if size > uint64(len(r.data)-p) || size < 4 {
		return bad("length %#x runs past the section end", size)
	}
	end := p + int(size)
	id, p, _ := r.u32(p, end)
	if id != 0 {
		return bad("is not a CIE (id %#x)", id)
	}
	if p >= end {
		return bad("version %v", errEhShort)
	}
	version := r.data[p]
	p++
	if version != 1 && version != 3 {
		return bad("unsupported version %d", version)
	}
	augStart := p
	for p < end && r.data[p] != 0 {
		p++
	}
	if p >= end {
		return bad("augmentation string %v", errEhShort)
	}
	aug := string(r.data[augStart:p])
	p++
	if len(aug) >= 2 && aug[:2] == "eh" {
		p += 8
		aug = aug[2:]
	}
	var v uint64
	if _, p, err = r.uleb(p, end); err != nil { // code alignment
		return bad("code alignment %v", err)
	}
	if _, p, err = r.sleb(p, end); err != nil { // data alignment
		return bad("data alignment %v", err)
	}
	if version == 1 {
		p++
	} else if _, p, err = r.uleb(p, end); err != nil {
		return bad("return register %v", err)
	}
	if p > end {
		return bad("header %v", errEhShort)
	}
	c := &cie{fdeEnc: pePtr}
	if aug != "" {
		if aug[0] != 'z' {
			return bad("augmentation %q without 'z' cannot be skipped", aug)
		}
		c.aug = true
		if v, p, err = r.uleb(p, end); err != nil || v > uint64(end-p) {
			return bad("augmentation data length %v", err)
		}
		augEnd := p + int(v)
	chars:
		for _, ch := range aug[1:] {
			switch ch {
			case 'R':
				if p >= augEnd {
					return bad("'R' %v", errEhShort)
				}
				c.fdeEnc = r.data[p]
				p++
			case 'L':
				p++
			case 'P':
				if p >= augEnd {
					return bad("'P' %v", errEhShort)
				}
				enc := r.data[p]
				if _, p, err = r.pointer(enc&^0x80, p+1, augEnd, false); err != nil {
					return bad("personality %v", err)
				}
			case 'S', 'B', 'G':
			default:
				break chars // the 'z' length lets us skip what we do not know
			}
		}
		if p > augEnd {
			return bad("augmentation data %v", errEhShort)
		}
	}
	r.cies[off] = c
	return c, nil
}

// fde parses the FDE whose length field is at start; its CIE pointer id was
// read at idAt, and its body runs from body to end.
func (r *ehReader) fde(start, idAt int, id uint32, body, end int) (fdeRange, error) {
	bad := func(format string, args ...any) (fdeRange, error) {
		return fdeRange{}, fmt.Errorf(".eh_frame FDE at offset %#x: %s", start, fmt.Sprintf(format, args...))
	}
	cieAt := idAt - int(id)
	if cieAt < 0 || cieAt >= start {
		return bad("CIE pointer %#x does not point to an earlier entry", id)
	}
	c, err := r.cie(cieAt)
	if err != nil {
		return bad("%v", err)
	}
	if c.fdeEnc == peOmit || c.fdeEnc&0x80 != 0 {
		return bad("unsupported address encoding %#x", c.fdeEnc)
	}
	pcBegin, p, err := r.pointer(c.fdeEnc, body, end, true)
	if err != nil {
		return bad("initial location %v", err)
	}
	pcRange, _, err := r.pointer(c.fdeEnc&0x0f, p, end, true)
	if err != nil {
		return bad("address range %v", err)
	}
	if pcBegin+pcRange < pcBegin {
		return bad("range %#x+%#x overflows", pcBegin, pcRange)
	}
	return fdeRange{pcBegin, pcBegin + pcRange}, nil
}

// pointer reads a DW_EH_PE-encoded value at p. apply says whether to add the
// base its application bits name (false only reads past the value).
func (r *ehReader) pointer(enc byte, p, end int, apply bool) (uint64, int, error) {
	at := p
	var v uint64
	var err error
	switch enc & 0x0f {
	case pePtr, peUData8, peSData8:
		v, p, err = r.u64(p, end)
	case peUData4:
		var x uint32
		x, p, err = r.u32(p, end)
		v = uint64(x)
	case peSData4:
		var x uint32
		x, p, err = r.u32(p, end)
		v = uint64(int64(int32(x)))
	case peUData2, peSData2:
		if end-p < 2 {
			return 0, p, errEhShort
		}
		x := binary.LittleEndian.Uint16(r.data[p:])
		p += 2
		v = uint64(x)
		if enc&0x0f == peSData2 {
			v = uint64(int64(int16(x)))
		}
	case peULEB128:
		v, p, err = r.uleb(p, end)
	case peSLEB128:
		var s int64
		s, p, err = r.sleb(p, end)
		v = uint64(s)
	default:
		return 0, p, fmt.Errorf("unknown pointer format %#x", enc)
	}
	if err != nil || !apply {
		return v, p, err
	}
	switch enc & 0x70 {
	case 0:
	case pePCRel:
		v += r.addr + uint64(at)
	case peTextRel:
		if r.bases.text == 0 {
			return 0, p, fmt.Errorf("text-relative pointer without a text base")
		}
		v += r.bases.text
	case peDataRel:
		if r.bases.data == 0 {
			return 0, p, fmt.Errorf("data-relative pointer without a data base")
		}
		v += r.bases.data
	default:
		return 0, p, fmt.Errorf("unsupported pointer application %#x", enc&0x70)
	}
	return v, p, nil
}

func (r *ehReader) u32(p, end int) (uint32, int, error) {
	if p < 0 || end-p < 4 {
		return 0, p, errEhShort
	}
	return binary.LittleEndian.Uint32(r.data[p:]), p + 4, nil
}

func (r *ehReader) u64(p, end int) (uint64, int, error) {
	if p < 0 || end-p < 8 {
		return 0, p, errEhShort
	}
	return binary.LittleEndian.Uint64(r.data[p:]), p + 8, nil
}

func (r *ehReader) uleb(p, end int) (uint64, int, error) {
	var v uint64
	for shift := uint(0); p < end; shift += 7 {
		b := r.data[p]
		p++
		if shift < 64 {
			v |= uint64(b&0x7f) << shift
		}
		if b&0x80 == 0 {
			return v, p, nil
		}
	}
	return 0, p, errEhShort
}

func (r *ehReader) sleb(p, end int) (int64, int, error) {
	var v int64
	for shift := uint(0); p < end; shift += 7 {
		b := r.data[p]
		p++
		if shift < 64 {
			v |= int64(b&0x7f) << shift
		}
		if b&0x80 == 0 {
			if shift+7 < 64 && b&0x40 != 0 {
				v |= -1 << (shift + 7)
			}
			return v, p, nil
		}
	}
	return 0, p, errEhShort
}
