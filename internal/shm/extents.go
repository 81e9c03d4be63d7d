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

// data returns the parts of the region's file that hold data.
func (r *Region) data() extents {
	if r.file == nil {
		return extents{all: true}
	}
	fd := int(r.file.Fd())
	size := int64(len(r.mem))
	var e extents
	for off := int64(0); off < size; {
		d, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) || (err == nil && d >= size) {
			break
		}
		if err != nil {
			return extents{all: true}
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			return extents{all: true}
		}
		if h > size {
			h = size
		}
		if h <= d {
			return extents{all: true} // the file changed under us: read everything
		}
		e.lo = append(e.lo, uint64(d))
		e.hi = append(e.hi, uint64(h))
		off = h
	}
	return e
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
