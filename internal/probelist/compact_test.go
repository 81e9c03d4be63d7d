package probelist

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// compactOf encodes l and opens the result.
func compactOf(t testing.TB, l *List) (*Index, []byte) {
	t.Helper()
	data, err := l.Compact()
	if err != nil {
		t.Fatal(err)
	}
	x, err := OpenCompact(data)
	if err != nil {
		t.Fatal(err)
	}
	return x, data
}

func TestCompactRoundTrip(t *testing.T) {
	for _, l := range []*List{sample(t), fentrySample(t)} {
		x, _ := compactOf(t, l)
		got, err := x.List()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, l) {
			t.Errorf("round trip changed the list:\n%+v\nwant\n%+v", got, l)
		}
		if x.Binary() != l.Binary || x.Placeholder() != l.Placeholder || x.Len() != len(l.Probes) {
			t.Errorf("header: %+v %s %d", x.Binary(), x.Placeholder(), x.Len())
		}
	}
}

// TestCompactSelect: the index selects exactly what the list selects, for
// names, globs, ids, kinds and providers, errors included.
func TestCompactSelect(t *testing.T) {
	for _, l := range []*List{sample(t), fentrySample(t), manyFunctions(t, 300)} {
		x, _ := compactOf(t, l)
		var names []string
		for _, p := range l.Probes {
			names = append(names, p.Function)
		}
		for _, pat := range append(names, "*", "s*", "sq", "f_1*", "f_2?", "[sf]*", "nothing", "id:0", "id:3", "id:99999", "z*", "", "\\*") {
			for _, kind := range []string{"", KindEntry, KindExit} {
				for _, prov := range []string{"", ProviderCyg, ProviderFentry} {
					s := Selector{Pattern: pat, Kind: kind, Provider: prov}
					want, werr := l.Select(s)
					got, gerr := x.Select(s)
					if fmt.Sprint(werr) != fmt.Sprint(gerr) || !reflect.DeepEqual(got, want) {
						t.Errorf("%+v: index %v, %v; list %v, %v", s, got, gerr, want, werr)
					}
				}
			}
		}
	}
}

// manyFunctions is a list of n functions with an entry and an exit probe
// each, in address order, names out of address order.
func manyFunctions(t testing.TB, n int) *List {
	l := sample(t)
	l.Probes = nil
	for i := 0; i < n; i++ {
		fn := fmt.Sprintf("f_%d", (i*7919)%n)
		for k, kind := range []string{KindEntry, KindExit} {
			addr := uint64(0x1000 + 32*i + 8*k)
			active := Bytes{0xe8, byte(i), 0, 0, 0}
			p := Probe{ID: len(l.Probes), Kind: kind, Provider: ProviderCyg, Function: fn, FunctionAddress: Hex(0x1000 + 32*i), Resolved: true,
				Container: fn, Hook: HookCygEnter, Address: Hex(addr), Offset: Hex(addr), Encoding: EncCallRel32,
				Placeholder: PlaceholderFlip, Active: active, Straddle: Straddle(addr, 5)}
			if kind == KindExit {
				p.Hook = HookCygExit
			}
			p.Inert, _ = InertForm(EncCallRel32, active, PlaceholderFlip)
			l.Probes = append(l.Probes, p)
		}
	}
	l.Binary.Size = int64(0x1000 + 32*n + 64)
	return l
}

func TestCompactAt(t *testing.T) {
	l := sample(t)
	x, _ := compactOf(t, l)
	for _, p := range l.Probes {
		got, ok, err := x.At(uint64(p.Address))
		if err != nil || !ok || got.ID != p.ID {
			t.Errorf("At(%s) = %v, %v, %v", p.Address, got, ok, err)
		}
		if _, ok, _ := x.At(uint64(p.Address) + 1); ok {
			t.Errorf("At(%s+1) found a probe", p.Address)
		}
	}
}

// TestCompactRejects: every corruption is refused with ErrCompact or
// ErrFormat, when opening or when the probe is decoded.
func TestCompactRejects(t *testing.T) {
	_, good := compactOf(t, sample(t))
	le := binary.LittleEndian
	reCRC := func(b []byte) { // a forger's record: the checksum made to fit
		r := b[compactHeaderSize : compactHeaderSize+recordSize]
		strOff := le.Uint32(b[24:])
		le.PutUint32(r[64:], recordCRC(r, b[strOff:]))
	}
	cases := []struct {
		name string
		edit func(b []byte) []byte
		want string
	}{
		{"empty", func(b []byte) []byte { return nil }, "no EPPROBES header"},
		{"magic", func(b []byte) []byte { b[0] = 'X'; return b }, "no EPPROBES header"},
		{"version", func(b []byte) []byte { b[8] = 1; return b }, "version 1"}, // CRC-32C, before D67
		{"future version", func(b []byte) []byte { b[8] = 3; return b }, "version 3"},
		{"truncated", func(b []byte) []byte { return b[:len(b)-1] }, "do not add up"},
		{"longer", func(b []byte) []byte { return append(b, 0) }, "do not add up"},
		{"count", func(b []byte) []byte { le.PutUint32(b[12:], 1<<30); return b }, "do not add up"},
		{"header byte", func(b []byte) []byte { b[33]++; return b }, "checksum"},
		{"index", func(b []byte) []byte { le.PutUint32(b[le.Uint32(b[20:]):], 3); return b }, "checksum"},
		{"record byte", func(b []byte) []byte { b[compactHeaderSize]++; return b }, "probe 0: checksum mismatch"},
		{"string byte", func(b []byte) []byte { b[len(b)-1]++; return b }, "checksum"},
		{"forged flip", func(b []byte) []byte { b[compactHeaderSize+55] = 0x99; reCRC(b); return b }, "differs from the active form in 2 bytes"},
		{"forged encoding", func(b []byte) []byte { b[compactHeaderSize+60] = 9; reCRC(b); return b }, "unknown encoding"},
		{"forged overlap", func(b []byte) []byte {
			le.PutUint64(b[compactHeaderSize:], 0x113c)
			reCRC(b)
			return b
		}, "overlaps or follows the next probe"},
		{"forged string", func(b []byte) []byte { le.PutUint32(b[compactHeaderSize+28:], 1<<20); reCRC(b); return b }, "outside the string table"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := c.edit(append([]byte(nil), good...))
			x, err := OpenCompact(b)
			if err == nil {
				_, err = x.List()
			}
			if err == nil || !strings.Contains(err.Error(), c.want) || !(errors.Is(err, ErrCompact) || errors.Is(err, ErrFormat)) {
				t.Errorf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// FuzzCompact: no input crashes OpenCompact or a decode; whatever decodes
// is a valid list that encodes back to the same probes.
func FuzzCompact(f *testing.F) {
	for _, l := range []*List{sample(f), fentrySample(f), manyFunctions(f, 5)} {
		data, err := l.Compact()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		x, err := OpenCompact(data)
		if err != nil {
			return
		}
		for _, pat := range []string{"*", "sq", "s*", "id:1"} {
			x.Select(Selector{Pattern: pat})
		}
		x.At(0x1110)
		l, err := x.List()
		if err != nil {
			return
		}
		if err := l.Validate(); err != nil {
			t.Fatalf("a decoded list is invalid: %v", err)
		}
		again, err := l.Compact()
		if err != nil {
			t.Fatal(err)
		}
		y, err := OpenCompact(again)
		if err != nil {
			t.Fatal(err)
		}
		l2, err := y.List()
		if err != nil || !reflect.DeepEqual(l, l2) {
			t.Fatalf("re-encoding changed the list: %v", err)
		}
		if !bytes.Equal(again, mustCompact(t, l2)) {
			t.Fatal("encoding is not deterministic")
		}
	})
}

func mustCompact(t *testing.T, l *List) []byte {
	b, err := l.Compact()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCompactDecodedOnce: past the small map of decoded probes, the index
// keeps every probe in a slice; each is decoded once and is the list's,
// whatever order they are asked in.
func TestCompactDecodedOnce(t *testing.T) {
	l := manyFunctions(t, 2*fewMax)
	x, _ := compactOf(t, l)
	first := map[int]*Probe{}
	for round := 0; round < 2; round++ {
		for k := range l.Probes {
			i := (k * 7) % len(l.Probes) // not in order
			p, err := x.Probe(i)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*p, l.Probes[i]) {
				t.Fatalf("probe %d: %+v, want %+v", i, *p, l.Probes[i])
			}
			if q, ok := first[i]; ok && q != p {
				t.Fatalf("probe %d decoded twice", i)
			}
			first[i] = p
		}
	}
	if x.decoded == nil || x.few != nil {
		t.Fatalf("after %d probes: slice %v, map %d", len(l.Probes), x.decoded != nil, len(x.few))
	}
}

// TestCompactSelectCorruptName: a record's function name spoiled (one bit
// of its string reference flipped, the record not re-checksummed) must
// never change what a name selects without an error: the name index is
// bisected on records' names, and a spoiled record on the bisection's
// path moved its bounds, so that `work` selected one of its two probes, or
// none ("matches nothing"), and the spoiled record was never decoded to be
// found out. Every answer is the true one or ErrCompact.
func TestCompactSelectCorruptName(t *testing.T) {
	l := manyFunctions(t, 300)
	_, good := compactOf(t, l)
	names := map[string]bool{}
	for _, p := range l.Probes {
		names[p.Function] = true
	}
	wrong := 0
	for i := 0; i < len(l.Probes); i += 7 {
		for _, bit := range []int{24*8 + 0, 24*8 + 3, 28*8 + 0, 28*8 + 2} { // the name's offset and length
			b := append([]byte(nil), good...)
			b[compactHeaderSize+i*recordSize+bit/8] ^= 1 << (bit % 8)
			x, err := OpenCompact(b)
			if err != nil {
				t.Fatalf("record %d bit %d: %v (the header's checksum does not cover records)", i, bit, err)
			}
			for name := range names {
				s := Selector{Pattern: name}
				want, _ := l.Select(s)
				got, err := x.Select(s)
				if errors.Is(err, ErrCompact) || err == nil && reflect.DeepEqual(got, want) {
					continue
				}
				if wrong++; wrong <= 5 {
					t.Errorf("record %d (%s) bit %d spoiled: %q selects %v, %v; want %v or ErrCompact", i, l.Probes[i].Function, bit, name, got, err, want)
				}
			}
		}
	}
	if wrong > 5 {
		t.Errorf("... %d wrong answers in all", wrong)
	}
}

// TestCompactAtCorruptAddress: the same for At and Covering, which bisect
// the records' addresses: a spoiled address (one bit flipped) must never
// make a probe that is there be reported absent, or another be returned,
// without an error (ErrCompact, or ErrFormat from a neighbour's order).
func TestCompactAtCorruptAddress(t *testing.T) {
	l := manyFunctions(t, 100)
	_, good := compactOf(t, l)
	wrong := 0
	for i := range l.Probes {
		for _, bit := range []int{2, 5, 9, 13} {
			b := append([]byte(nil), good...)
			b[compactHeaderSize+i*recordSize+bit/8] ^= 1 << (bit % 8)
			x, err := OpenCompact(b)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range l.Probes {
				for _, at := range []uint64{uint64(p.Address), uint64(p.Address) + 2} {
					var got *Probe
					var ok bool
					if at == uint64(p.Address) {
						got, ok, err = x.At(at)
					} else {
						got, ok, err = x.Covering(at)
					}
					if errors.Is(err, ErrCompact) || errors.Is(err, ErrFormat) || err == nil && ok && got.ID == p.ID {
						continue
					}
					if wrong++; wrong <= 5 {
						t.Errorf("record %d bit %d spoiled: probe %d at %#x: %v, %v, %v", i, bit, p.ID, at, got, ok, err)
					}
				}
			}
		}
	}
	if wrong > 5 {
		t.Errorf("... %d wrong answers in all", wrong)
	}
}
