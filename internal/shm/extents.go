package shm

import (
	"errors"
	"os"
	"sort"

	"golang.org/x/sys/unix"
)

// A region is mostly reserve: thread slots no thread claimed, function-table
// slots no key landed in, address space for segments and rings not in use.
// Those pages read as zeros, but reading one through a shared mapping of the
// runtime's memfd makes the kernel allocate it: a reader that scanned every
// slot made an idle process's region hold megabytes (7.4 MiB after one
// Functions call, against 4 KiB before). So scans first ask the file which
// parts hold data (lseek SEEK_DATA/SEEK_HOLE: a swapped-out page counts as
// data, a page never written does not) and skip the rest, which holds
// nothing but zeros. A page written after the question is seen at the next
// scan, as if the scan had run a moment earlier.

// extents are the byte ranges of the file that hold data, sorted and
// disjoint; nil means "all of it" (no file to ask, or it could not say).
type extents struct {
	lo, hi []uint64
	all    bool
}

// data returns the parts of the given byte ranges of the region's file that
// hold data (ranges in increasing order, inside the region). Only those
// ranges are walked: a live region's rings and counters may hold many
// extents that a scan of the thread slots or keys does not need.
func (r *Region) data(ranges ...[2]uint64) extents {
	if r.file == nil {
		return extents{all: true}
	}
	fd := int(r.file.Fd())
	size := uint64(len(r.mem))
	var e extents
	for _, rg := range ranges {
		end := min(rg[1], size)
		for off := rg[0]; off < end; {
			d, err := unix.Seek(fd, int64(off), unix.SEEK_DATA)
			if errors.Is(err, unix.ENXIO) || (err == nil && uint64(d) >= end) {
				break
			}
			if err != nil {
				return extents{all: true}
			}
			h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
			if err != nil {
				return extents{all: true}
			}
			if uint64(h) <= uint64(d) {
				return extents{all: true} // the file changed under us: read everything
			}
			hi := min(uint64(h), end)
			if n := len(e.hi); n > 0 && e.hi[n-1] >= uint64(d) {
				e.hi[n-1] = max(e.hi[n-1], hi) // ranges that touch
			} else {
				e.lo = append(e.lo, uint64(d))
				e.hi = append(e.hi, hi)
			}
			off = hi
		}
	}
	return e
}

// threadRange is the byte range of the thread slots.
func (r *Region) threadRange() [2]uint64 {
	return [2]uint64{r.hdr.ThreadOff, r.hdr.ThreadOff + uint64(r.hdr.MaxThreads)*uint64(r.hdr.ThreadSize)}
}

// keysRange is the byte range of the function table's keys in use.
func (r *Region) keysRange() [2]uint64 {
	return [2]uint64{r.hdr.KeysOff, r.hdr.KeysOff + r.FuncSlots()*8}
}

// has reports whether any of the n bytes at off may hold data.
func (e extents) has(off, n uint64) bool {
	if e.all {
		return true
	}
	i := sort.Search(len(e.hi), func(i int) bool { return e.hi[i] > off })
	return i < len(e.lo) && e.lo[i] < off+n
}

// dupFile keeps a descriptor of the region's file for data's questions.
func dupFile(f *os.File) *os.File {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil // scans then read everything, as before
	}
	return os.NewFile(uintptr(fd), f.Name())
}
