package probelist

import (
	"encoding/binary"
	"sort"
)

// Covering returns the probe whose site holds ELF address addr (its first
// byte or any later one), decoding only that probe. The records are in
// address order and never overlap, so at most one site covers addr.
func (x *Index) Covering(addr uint64) (*Probe, bool, error) {
	// The first record past addr; the one before it is the candidate.
	i := sort.Search(x.n, func(i int) bool { return binary.LittleEndian.Uint64(x.record(i)) > addr }) - 1
	if i < 0 {
		return nil, false, nil
	}
	a, n, ok := x.addrOf(i)
	if !ok || addr >= a+n {
		return nil, false, nil
	}
	p, err := x.Probe(i)
	return p, err == nil, err
}
