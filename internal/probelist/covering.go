package probelist

// Covering returns the probe whose site holds ELF address addr (its first
// byte or any later one), decoding only that probe. The records are in
// address order and never overlap, so at most one site covers addr.
func (x *Index) Covering(addr uint64) (*Probe, bool, error) {
	// The first record past addr; the one before it is the candidate.
	i, err := x.addrSearch(func(a uint64) bool { return a > addr })
	if err != nil {
		return nil, false, err
	}
	if i--; i < 0 {
		return nil, false, nil
	}
	a, n, ok := x.addrOf(i)
	if !ok || addr >= a+n {
		return nil, false, nil
	}
	p, err := x.Probe(i)
	return p, err == nil, err
}
