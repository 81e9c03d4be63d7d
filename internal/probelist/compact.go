package probelist

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"path"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// The compact form of a probe list: what hotpatch loads instead of parsing
// JSON (internal/probecache keeps it). It is an internal format, never an
// interface: the JSON document is. Fixed-size records in address order, an
// index of the records by function name, and one string table, so that a
// request touches the header, O(log n) index entries and the records it
// selects, whatever the size of the list:
//
//	header (compactHeaderSize bytes)
//	records: count x recordSize bytes, in address order (id = position)
//	index:   count x u32, record numbers sorted by (function, id)
//	strings: every string once
//
// Everything is little-endian. A record holds its addresses, its function,
// container and source as (offset, length) into the strings, its active and
// inert bytes, and its enumerations as small numbers; a CRC-32 covers the
// record and the bytes of its strings. The header's CRC-32 covers the
// header, its strings and the index. Nothing is trusted: every record is
// checked when first decoded, with the rules Read applies to JSON (and
// against its neighbours for order), so a corrupt or forged file is refused,
// never half-used. docs/probe-list.md says why the JSON stays the interface.
const (
	compactMagic      = "EPPROBES"
	compactVersion    = 2 // 2: CRC-32 (IEEE) instead of CRC-32C
	compactHeaderSize = 80
	recordSize        = 72
)

// ErrCompact is wrapped by every error about a compact probe list.
var ErrCompact = errors.New("invalid compact probe list")

// crcTable is CRC-32 (IEEE), not CRC-32C as in version 1: Go makes the
// CRC-32C tables for its SSE4.2 code on first use, 1.2 million instructions
// (about 0.2 ms) that every hotpatch reading a list paid, where the IEEE
// polynomial's PCLMULQDQ code needs one small table (D67). Both detect what
// the checksums are for: a damaged or hand-edited file.
var crcTable = crc32.IEEETable

// The enumerations, as stored: 0 is never valid.
var (
	encodingCodes    = []string{"", EncCallRel32, EncJmpRel32, EncCallGOT, EncJmpGOT, EncAddr32Call}
	hookCodes        = []string{"", HookCygEnter, HookCygExit, HookCygEnterBare, HookFentry}
	kindCodes        = []string{"", KindEntry, KindExit}
	providerCodes    = []string{"", ProviderCyg, ProviderFentry}
	placeholderCodes = []string{"", PlaceholderFlip, PlaceholderNop}
	typeCodes        = []string{"", "exec", "dyn"}
)

func code(table []string, s string) byte {
	for i, v := range table {
		if i > 0 && v == s {
			return byte(i)
		}
	}
	return 0
}

func decodeCode(table []string, c byte) string {
	if int(c) < len(table) {
		return table[c]
	}
	return ""
}

// strRef is a string's place in the string table.
type strRef struct{ off, n uint32 }

type stringTable struct {
	buf  bytes.Buffer
	refs map[string]strRef
}

func (t *stringTable) add(s string) strRef {
	if s == "" {
		return strRef{}
	}
	if r, ok := t.refs[s]; ok {
		return r
	}
	r := strRef{uint32(t.buf.Len()), uint32(len(s))}
	t.buf.WriteString(s)
	t.refs[s] = r
	return r
}

func putRef(b []byte, r strRef) {
	binary.LittleEndian.PutUint32(b, r.off)
	binary.LittleEndian.PutUint32(b[4:], r.n)
}

func getRef(b []byte) strRef {
	return strRef{binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:])}
}

// Compact encodes a valid list (Validate passes) in the compact form.
func (l *List) Compact() ([]byte, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	n := len(l.Probes)
	if uint64(n)*recordSize > 1<<31 {
		return nil, fmt.Errorf("%w: %d probes is too many for the compact form", ErrCompact, n)
	}
	st := &stringTable{refs: map[string]strRef{}}
	path, build, soname := st.add(l.Binary.Path), st.add(l.Binary.BuildID), st.add(l.Binary.Soname)
	recs := make([]byte, n*recordSize)
	refs := make([][3]strRef, n)
	for i := range l.Probes {
		p := &l.Probes[i]
		r := recs[i*recordSize : (i+1)*recordSize]
		binary.LittleEndian.PutUint64(r[0:], uint64(p.Address))
		binary.LittleEndian.PutUint64(r[8:], uint64(p.Offset))
		binary.LittleEndian.PutUint64(r[16:], uint64(p.FunctionAddress))
		refs[i] = [3]strRef{st.add(p.Function), st.add(p.Container), st.add(p.Source)}
		putRef(r[24:], refs[i][0])
		putRef(r[32:], refs[i][1])
		putRef(r[40:], refs[i][2])
		copy(r[48:54], p.Active)
		copy(r[54:60], p.Inert)
		r[60] = code(encodingCodes, p.Encoding)
		r[61] = code(hookCodes, p.Hook)
		r[62] = code(kindCodes, p.Kind) | code(providerCodes, p.Provider)<<2 | code(placeholderCodes, p.Placeholder)<<4
		if p.Resolved {
			r[62] |= 1 << 6
		}
	}
	strs := st.buf.Bytes()
	if uint64(len(strs)) > 1<<31 {
		return nil, fmt.Errorf("%w: string table too large", ErrCompact)
	}
	for i := range l.Probes {
		r := recs[i*recordSize : (i+1)*recordSize]
		binary.LittleEndian.PutUint32(r[64:], recordCRC(r, strs))
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return l.Probes[order[a]].Function < l.Probes[order[b]].Function })
	index := make([]byte, 4*n)
	for i, k := range order {
		binary.LittleEndian.PutUint32(index[4*i:], uint32(k))
	}
	recsOff := compactHeaderSize
	indexOff := recsOff + len(recs)
	strOff := indexOff + len(index)
	h := make([]byte, compactHeaderSize)
	copy(h, compactMagic)
	binary.LittleEndian.PutUint32(h[8:], compactVersion)
	binary.LittleEndian.PutUint32(h[12:], uint32(n))
	binary.LittleEndian.PutUint32(h[16:], uint32(recsOff))
	binary.LittleEndian.PutUint32(h[20:], uint32(indexOff))
	binary.LittleEndian.PutUint32(h[24:], uint32(strOff))
	binary.LittleEndian.PutUint32(h[28:], uint32(len(strs)))
	binary.LittleEndian.PutUint64(h[32:], uint64(l.Binary.Size))
	putRef(h[40:], path)
	putRef(h[48:], build)
	putRef(h[56:], soname)
	h[64] = code(typeCodes, l.Binary.Type)
	h[65] = code(placeholderCodes, l.Placeholder)
	out := make([]byte, 0, strOff+len(strs))
	out = append(append(append(append(out, h...), recs...), index...), strs...)
	binary.LittleEndian.PutUint32(out[72:], headerCRC(out, indexOff, strOff, strs, path, build, soname))
	return out, nil
}

// recordCRC covers a record (but its CRC field) and its strings' bytes.
func recordCRC(r, strs []byte) uint32 {
	c := crc32.Update(0, crcTable, r[:64])
	c = crc32.Update(c, crcTable, r[68:recordSize])
	for _, at := range []int{24, 32, 40} {
		ref := getRef(r[at:])
		if s, ok := sliceOf(strs, ref); ok {
			c = crc32.Update(c, crcTable, s)
		}
	}
	return c
}

func headerCRC(data []byte, indexOff, strOff int, strs []byte, refs ...strRef) uint32 {
	c := crc32.Update(0, crcTable, data[:72])
	c = crc32.Update(c, crcTable, data[76:compactHeaderSize])
	c = crc32.Update(c, crcTable, data[indexOff:strOff])
	for _, r := range refs {
		if s, ok := sliceOf(strs, r); ok {
			c = crc32.Update(c, crcTable, s)
		}
	}
	return c
}

func sliceOf(strs []byte, r strRef) ([]byte, bool) {
	if uint64(r.off)+uint64(r.n) > uint64(len(strs)) {
		return nil, false
	}
	return strs[r.off : r.off+r.n], true
}

// Index is a probe list in the compact form, decoded on demand: Select,
// Probe and At decode (and check) only the probes they reach. It holds the
// bytes it was opened on; they must not change. Its methods are safe for
// concurrent use.
type Index struct {
	data        []byte
	n           int
	recs, index []byte
	strs        []byte
	binary      Binary
	placeholder string

	mu sync.Mutex
	// The probes decoded so far: in a small map while they are few (a
	// toggle of one function of a huge list stays independent of its
	// size), then in a slice of every probe (selecting all of a
	// 40,000-probe list decodes them all, and a map's hashing and growth
	// would cost more than the decoding).
	few     map[int]*Probe
	decoded []*Probe
	digest  *[32]byte // Digest, once computed

	// origin and corrupt are OnCorrupt's.
	origin  string
	corrupt func()

	// soundBits: the records sound has found sound, one bit each.
	soundBits []atomic.Uint64
}

// OnCorrupt names where the bytes came from for the error of a record
// that fails its checks, and sets f to be called (once) when one does: a
// cache removes its entry then, so that the next reader rebuilds it.
func (x *Index) OnCorrupt(origin string, f func()) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.origin, x.corrupt = origin, f
}

// Digest is the SHA-256 of the compact bytes the index was opened on: two
// indexes with one digest hold the same probes, whatever file or cache
// entry they came from (hotpatch keys its verification cache by it).
func (x *Index) Digest() [32]byte {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.digest == nil {
		d := sha256.Sum256(x.data)
		x.digest = &d
	}
	return *x.digest
}

// fewMax is how many decoded probes the map holds before the slice.
const fewMax = 256

// OpenCompact checks a compact list's header, its index's checksum and the
// extent of every part; the records are checked as they are decoded.
func OpenCompact(data []byte) (*Index, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrCompact, fmt.Sprintf(format, args...))
	}
	if len(data) < compactHeaderSize || string(data[:8]) != compactMagic {
		return nil, bad("no %s header", compactMagic)
	}
	le := binary.LittleEndian
	if v := le.Uint32(data[8:]); v != compactVersion {
		return nil, bad("version %d (this build reads %d)", v, compactVersion)
	}
	n := uint64(le.Uint32(data[12:]))
	recsOff, indexOff, strOff, strLen := uint64(le.Uint32(data[16:])), uint64(le.Uint32(data[20:])), uint64(le.Uint32(data[24:])), uint64(le.Uint32(data[28:]))
	if recsOff != compactHeaderSize || indexOff != recsOff+n*recordSize || strOff != indexOff+4*n || strOff+strLen != uint64(len(data)) {
		return nil, bad("the parts' extents do not add up to the %d bytes", len(data))
	}
	x := &Index{data: data, n: int(n), recs: data[recsOff:indexOff], index: data[indexOff:strOff], strs: data[strOff:],
		soundBits: make([]atomic.Uint64, (n+63)/64)}
	if data[66] != 0 || data[67] != 0 || le.Uint32(data[68:]) != 0 || le.Uint32(data[76:]) != 0 {
		return nil, bad("reserved header bytes are not zero")
	}
	refs := []strRef{getRef(data[40:]), getRef(data[48:]), getRef(data[56:])}
	var s [3]string
	for i, r := range refs {
		b, ok := sliceOf(x.strs, r)
		if !ok {
			return nil, bad("header string %d lies outside the string table", i)
		}
		s[i] = string(b)
	}
	if le.Uint32(data[72:]) != headerCRC(data, int(indexOff), int(strOff), x.strs, refs...) {
		return nil, bad("header or index checksum mismatch")
	}
	x.binary = Binary{Path: s[0], BuildID: s[1], Soname: s[2], Size: int64(le.Uint64(data[32:])), Type: decodeCode(typeCodes, data[64])}
	x.placeholder = decodeCode(placeholderCodes, data[65])
	if err := x.binary.validate(Format, Version, x.placeholder); err != nil {
		return nil, err
	}
	return x, nil
}

// Binary is the object the list describes.
func (x *Index) Binary() Binary { return x.binary }

// Placeholder is the list's placeholder style.
func (x *Index) Placeholder() string { return x.placeholder }

// Len is the number of probes.
func (x *Index) Len() int { return x.n }

func (x *Index) record(i int) []byte { return x.recs[i*recordSize : (i+1)*recordSize] }

// addrOf returns record i's address and length, checking only its encoding.
func (x *Index) addrOf(i int) (uint64, uint64, bool) {
	r := x.record(i)
	n := EncodingLength(decodeCode(encodingCodes, r[60]))
	return binary.LittleEndian.Uint64(r), uint64(n), n > 0
}

func (x *Index) str(r []byte) (string, bool) {
	b, ok := sliceOf(x.strs, getRef(r))
	return string(b), ok
}

// Probe decodes and checks probe i (its id), once.
func (x *Index) Probe(i int) (*Probe, error) {
	if i < 0 || i >= x.n {
		return nil, fmt.Errorf("%w: probe %d of %d", ErrCompact, i, x.n)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.decoded != nil {
		if p := x.decoded[i]; p != nil {
			return p, nil
		}
	} else if p := x.few[i]; p != nil {
		return p, nil
	}
	p, err := x.decode(i)
	if err != nil {
		if x.corrupt != nil {
			x.corrupt()
			x.corrupt = nil
		}
		if x.origin != "" {
			err = fmt.Errorf("%s: %w", x.origin, err)
		}
		return nil, err
	}
	switch {
	case x.decoded != nil:
		x.decoded[i] = p
	case len(x.few) < fewMax:
		if x.few == nil {
			x.few = map[int]*Probe{}
		}
		x.few[i] = p
	default:
		x.decoded = make([]*Probe, x.n)
		for j, q := range x.few {
			x.decoded[j] = q
		}
		x.decoded[i] = p
		x.few = nil
	}
	return p, nil
}

func (x *Index) decode(i int) (*Probe, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: probe %d: %s", ErrCompact, i, fmt.Sprintf(format, args...))
	}
	r := x.record(i)
	le := binary.LittleEndian
	if r[63] != 0 || le.Uint32(r[68:]) != 0 || r[62]&0x80 != 0 {
		return nil, bad("reserved bytes are not zero")
	}
	if le.Uint32(r[64:]) != recordCRC(r, x.strs) {
		return nil, bad("checksum mismatch")
	}
	fn, ok1 := x.str(r[24:])
	container, ok2 := x.str(r[32:])
	source, ok3 := x.str(r[40:])
	if !ok1 || !ok2 || !ok3 {
		return nil, bad("a string lies outside the string table")
	}
	p := &Probe{ID: i, Address: Hex(le.Uint64(r)), Offset: Hex(le.Uint64(r[8:])), FunctionAddress: Hex(le.Uint64(r[16:])),
		Function: fn, Container: container, Source: source,
		Encoding: decodeCode(encodingCodes, r[60]), Hook: decodeCode(hookCodes, r[61]),
		Kind: decodeCode(kindCodes, r[62]&3), Provider: decodeCode(providerCodes, r[62]>>2&3),
		Placeholder: decodeCode(placeholderCodes, r[62]>>4&3), Resolved: r[62]&(1<<6) != 0}
	n := EncodingLength(p.Encoding)
	if n == 0 {
		return nil, bad("unknown encoding %d", r[60])
	}
	p.Active, p.Inert = append(Bytes(nil), r[48:48+n]...), append(Bytes(nil), r[54:54+n]...)
	for _, b := range append(append([]byte(nil), r[48+n:54]...), r[54+n:60]...) {
		if b != 0 {
			return nil, bad("bytes past the %s site are not zero", p.Encoding)
		}
	}
	p.Straddle = Straddle(uint64(p.Address), n)
	if err := p.validate(i, x.binary.Size); err != nil {
		return nil, err
	}
	// Address order, and no overlap, with both neighbours.
	addr := uint64(p.Address)
	if i > 0 {
		if a, l, ok := x.addrOf(i - 1); !ok || a+l < a || a+l > addr {
			return nil, p.bad(i, "overlaps or precedes the previous probe")
		}
	}
	if i+1 < x.n {
		if a, _, ok := x.addrOf(i + 1); !ok || addr+uint64(n) > a {
			return nil, p.bad(i, "overlaps or follows the next probe")
		}
	}
	return p, nil
}

// List decodes every probe into a List.
func (x *Index) List() (*List, error) {
	l := &List{Format: Format, Version: Version, Binary: x.binary, Placeholder: x.placeholder, Probes: make([]Probe, x.n)}
	for i := range l.Probes {
		p, err := x.Probe(i)
		if err != nil {
			return nil, err
		}
		l.Probes[i] = *p
	}
	return l, nil
}

// At returns the probe whose site starts at ELF address addr.
func (x *Index) At(addr uint64) (*Probe, bool, error) {
	i, err := x.addrSearch(func(a uint64) bool { return a >= addr })
	if err != nil {
		return nil, false, err
	}
	if i == x.n || binary.LittleEndian.Uint64(x.record(i)) != addr {
		return nil, false, nil
	}
	p, err := x.Probe(i)
	return p, err == nil, err
}

// indexed returns the record number at position k of the name index, and
// its function name.
func (x *Index) indexed(k int) (int, string, bool) {
	i := int(binary.LittleEndian.Uint32(x.index[4*k:]))
	if i >= x.n {
		return 0, "", false
	}
	name, ok := x.str(x.record(i)[24:])
	return i, name, ok
}

// addrSearch is sort.Search over the records' addresses, each one it
// compares from a record that passes its checksum (sound): a spoiled
// address on the bisection's path would send it past the probe it looks
// for, which would then be reported absent. A record that fails is
// decoded for its error (and OnCorrupt).
func (x *Index) addrSearch(f func(addr uint64) bool) (int, error) {
	bad := -1
	i := sort.Search(x.n, func(i int) bool {
		if bad < 0 && !x.sound(i) {
			bad = i
		}
		return f(binary.LittleEndian.Uint64(x.record(i)))
	})
	if bad >= 0 {
		if _, err := x.Probe(bad); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%w: probe %d: checksum mismatch", ErrCompact, bad)
	}
	return i, nil
}

// sound reports whether record i passes its checksum (with its strings'
// bytes), the first of decode's checks: enough to trust the name or the
// address it gives a bisection. A record found sound is remembered (the
// bisections of a whole list's lookups share their first steps: without
// it, checking 40,000 probes' addresses cost 40 ms more).
func (x *Index) sound(i int) bool {
	w, bit := &x.soundBits[i/64], uint64(1)<<(i%64)
	if w.Load()&bit != 0 {
		return true
	}
	r := x.record(i)
	if binary.LittleEndian.Uint32(r[64:]) != recordCRC(r, x.strs) {
		return false
	}
	w.Or(bit)
	return true
}

// Select is List.Select: it finds the candidates in the name index (a
// name, or the names that share a glob's literal prefix) and decodes only
// those.
func (x *Index) Select(s Selector) ([]int, error) {
	return selectProbes(s, x.n, func(yield func(int) bool) {
		lo, hi, err := x.nameRange(s.Pattern)
		if err != nil {
			// A broken index: fall back to every probe, each checked.
			lo, hi = 0, -1
		}
		var cand []int
		if hi < 0 {
			for i := 0; i < x.n; i++ {
				cand = append(cand, i)
			}
		} else {
			for k := lo; k < hi; k++ {
				i, _, _ := x.indexed(k)
				cand = append(cand, i)
			}
			sort.Ints(cand)
		}
		for _, i := range cand {
			if !yield(i) {
				return
			}
		}
	}, x.Probe)
}

// nameRange returns the index positions [lo, hi) whose names may match
// pattern: those equal to it, or starting with its literal prefix.
func (x *Index) nameRange(pattern string) (int, int, error) {
	prefix, exact := pattern, true
	if i := strings.IndexAny(pattern, `*?[\`); i >= 0 {
		prefix, exact = pattern[:i], false
	}
	// Every name the bisection compares is a record's checked one: the
	// index is in the header's checksum, the names are only in their
	// records', and a spoiled name on the bisection's path would move the
	// range's bounds past records that match, which would then never be
	// decoded (and found out). A record that fails makes the index broken:
	// Select then decodes every probe, and that one refuses the list.
	var broken bool
	name := func(k int) string {
		i, s, ok := x.indexed(k)
		broken = broken || !ok || !x.sound(i)
		return s
	}
	lo := sort.Search(x.n, func(k int) bool { return name(k) >= prefix })
	hi := sort.Search(x.n, func(k int) bool {
		s := name(k)
		if exact {
			return s > prefix
		}
		return s >= prefix && !strings.HasPrefix(s, prefix)
	})
	if broken || hi < lo {
		return 0, 0, fmt.Errorf("%w: name index", ErrCompact)
	}
	if !exact {
		// A glob's other characters are matched on each candidate.
		if _, err := path.Match(pattern, ""); err != nil {
			return 0, 0, err
		}
	}
	return lo, hi, nil
}
