package probelist

import "testing"

// TestCovering: every byte of every site names that site; the byte before
// the first site and the byte after each site name none (unless the next
// site starts there).
func TestCovering(t *testing.T) {
	for _, l := range []*List{sample(t), fentrySample(t)} {
		x, _ := compactOf(t, l)
		starts := map[uint64]bool{}
		for _, p := range l.Probes {
			starts[uint64(p.Address)] = true
		}
		for _, p := range l.Probes {
			a := uint64(p.Address)
			for k := uint64(0); k < uint64(len(p.Active)); k++ {
				got, ok, err := x.Covering(a + k)
				if err != nil || !ok || got.ID != p.ID {
					t.Errorf("Covering(%#x) = %v, %v, %v; want probe %d", a+k, got, ok, err, p.ID)
				}
			}
			end := a + uint64(len(p.Active))
			if got, ok, _ := x.Covering(end); ok && !starts[end] {
				t.Errorf("Covering(%#x), just past probe %d, = probe %d", end, p.ID, got.ID)
			}
		}
		if first := uint64(l.Probes[0].Address); first > 0 {
			if got, ok, _ := x.Covering(first - 1); ok {
				t.Errorf("Covering(%#x) before every site = probe %d", first-1, got.ID)
			}
		}
	}
}
