package shm

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestExtents: a memfd like the runtime's, written at two places, reports
// exactly those pages as data, and has() answers for ranges that straddle
// them; without a file every range may hold data.
func TestExtents(t *testing.T) {
	fd, err := unix.MemfdCreate("edgeprobe-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatalf("memfd_create: %v (the runtime needs it too)", err)
	}
	f := os.NewFile(uintptr(fd), "memfd")
	defer f.Close()
	const page, size = 4096, 64 * 4096
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{3 * page, 40 * page} {
		if _, err := f.WriteAt([]byte{1}, off+100); err != nil {
			t.Fatal(err)
		}
	}
	r := &Region{mem: make([]byte, size), file: f}
	d := r.data([2]uint64{0, size})
	if d.all || len(d.lo) != 2 || d.lo[0] != 3*page || d.hi[0] != 4*page || d.lo[1] != 40*page || d.hi[1] != 41*page {
		t.Fatalf("extents %+v, want [3p,4p) and [40p,41p)", d)
	}
	for _, c := range []struct {
		off, n uint64
		want   bool
	}{
		{0, page, false}, {0, 3 * page, false}, {0, 3*page + 1, true}, {3 * page, 8, true},
		{4*page - 8, 8, true}, {4 * page, 8, false}, {39 * page, page, false}, {39 * page, page + 1, true},
		{41 * page, 23 * page, false}, {0, size, true},
	} {
		if got := d.has(c.off, c.n); got != c.want {
			t.Errorf("has(%d, %d) = %v, want %v", c.off, c.n, got, c.want)
		}
	}
	// Only the ranges asked about are walked.
	if d := r.data([2]uint64{0, 20 * page}, [2]uint64{50 * page, size}); len(d.lo) != 1 || d.lo[0] != 3*page || d.has(40*page, page) {
		t.Errorf("extents of two ranges %+v, want [3p,4p) only", d)
	}
	if !(&Region{mem: make([]byte, size)}).data([2]uint64{0, size}).has(0, 1) {
		t.Error("a region without a file must be read whole")
	}
}
