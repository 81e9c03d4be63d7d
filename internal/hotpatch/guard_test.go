package hotpatch

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// fakeMem is a process's memory for inflightGuard: text bytes and the
// table, with a write budget after which every write fails (a hotpatch
// killed there).
type fakeMem struct {
	b        map[uint64]byte
	writes   int // writes left; < 0: unlimited
	unmapped map[uint64]bool
}

var errKilled = errors.New("killed")

func (m *fakeMem) ReadMem(addr uint64, b []byte) error {
	if m.unmapped[addr] {
		return errors.New("input/output error")
	}
	for i := range b {
		b[i] = m.b[addr+uint64(i)]
	}
	return nil
}

func (m *fakeMem) WriteMem(addr uint64, b []byte) error {
	if m.writes == 0 {
		return errKilled
	}
	if m.writes > 0 {
		m.writes--
	}
	for i, v := range b {
		m.b[addr+uint64(i)] = v
	}
	return nil
}

// listed is what the runtime's handler would find: the addresses of the
// first count entries.
func (m *fakeMem) listed(table uint64) map[uint64]bool {
	var c [8]byte
	m.ReadMem(table+shm.InflightCountOff, c[:])
	n := binary.LittleEndian.Uint64(c[:])
	out := map[uint64]bool{}
	for i := uint64(0); i < n; i++ {
		var a [8]byte
		m.ReadMem(table+shm.InflightSitesOff+i*shm.InflightSiteSize, a[:])
		out[binary.LittleEndian.Uint64(a[:])] = true
	}
	return out
}

const fakeTable = 0x10000000

func fakeSite(i int) xmod.Site {
	return xmod.Site{Addr: 0x400000 + uint64(i)*16, Active: []byte{0xe8, 1, 2, 3, 4}, Inert: []byte{0x0f, 0x1f, 0x44, 0, 0}}
}

// TestInflightGuardCompact fills a table of 8 entries, puts an int3 on some
// of their sites, and lists more sites: the entries of whole sites must go
// and every site holding an int3 must stay listed — also at every instant
// of a hotpatch killed in the middle of the compaction (each possible
// number of writes before the kill), which is what its order is for.
func TestInflightGuardCompact(t *testing.T) {
	const max = 8
	cc := map[int]bool{1: true, 4: true, 6: true}
	for budget := 0; budget <= max+4; budget++ {
		m := &fakeMem{b: map[uint64]byte{}, writes: -1}
		g := &inflightGuard{t: m, addr: fakeTable, max: max, listed: map[uint64]bool{}}
		var first []xmod.Site
		for i := 0; i < max; i++ {
			s := fakeSite(i)
			first = append(first, s)
			m.WriteMem(s.Addr, s.Inert)
		}
		if err := g.Record(first); err != nil {
			t.Fatal(err)
		}
		for i := range cc {
			m.b[fakeSite(i).Addr] = 0xcc
		}
		more := []xmod.Site{fakeSite(100), fakeSite(101)}
		m.writes = budget
		err := g.Record(more)
		got := m.listed(fakeTable)
		for i := range cc {
			if !got[fakeSite(i).Addr] {
				t.Fatalf("write budget %d: site %d holds an int3 and is not listed (Record: %v)", budget, i, err)
			}
		}
		if err == nil {
			if len(got) != len(cc)+len(more) {
				t.Fatalf("after compaction %d entries listed, want %d: %v", len(got), len(cc)+len(more), got)
			}
			for _, s := range more {
				if !got[s.Addr] {
					t.Fatalf("new site %#x not listed", s.Addr)
				}
			}
		} else if !errors.Is(err, errKilled) {
			t.Fatalf("write budget %d: %v", budget, err)
		}
	}
}

// TestInflightGuardFull: a table whose every site holds an int3 cannot make
// room; Record fails with ErrGuardFull and writes nothing.
func TestInflightGuardFull(t *testing.T) {
	m := &fakeMem{b: map[uint64]byte{}, writes: -1}
	g := &inflightGuard{t: m, addr: fakeTable, max: 2, listed: map[uint64]bool{}}
	if err := g.Record([]xmod.Site{fakeSite(0), fakeSite(1)}); err != nil {
		t.Fatal(err)
	}
	m.b[fakeSite(0).Addr], m.b[fakeSite(1).Addr] = 0xcc, 0xcc
	err := g.Record([]xmod.Site{fakeSite(2)})
	if !errors.Is(err, xmod.ErrGuardFull) {
		t.Fatalf("Record on a full table: %v, want ErrGuardFull", err)
	}
	if got := m.listed(fakeTable); len(got) != 2 || !got[fakeSite(0).Addr] || !got[fakeSite(1).Addr] {
		t.Fatalf("the table changed: %v", got)
	}
	// Listing a site already listed costs nothing and succeeds.
	if err := g.Record([]xmod.Site{fakeSite(1)}); err != nil {
		t.Fatal(err)
	}
}

// TestInflightGuardUnmapped: an entry whose site can no longer be read (its
// object was unloaded) is dropped by a compaction, not an error that would
// refuse every later int3 batch.
func TestInflightGuardUnmapped(t *testing.T) {
	m := &fakeMem{b: map[uint64]byte{}, writes: -1, unmapped: map[uint64]bool{}}
	g := &inflightGuard{t: m, addr: fakeTable, max: 2, listed: map[uint64]bool{}}
	if err := g.Record([]xmod.Site{fakeSite(0), fakeSite(1)}); err != nil {
		t.Fatal(err)
	}
	m.b[fakeSite(1).Addr] = 0xcc
	m.unmapped[fakeSite(0).Addr] = true
	if err := g.Record([]xmod.Site{fakeSite(2)}); err != nil {
		t.Fatalf("Record after an unmapped entry: %v", err)
	}
	got := m.listed(fakeTable)
	if len(got) != 2 || !got[fakeSite(1).Addr] || !got[fakeSite(2).Addr] {
		t.Fatalf("listed %v, want sites 1 and 2", got)
	}
}
