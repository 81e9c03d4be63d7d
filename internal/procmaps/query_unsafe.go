package procmaps

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// procmapQuery is struct procmap_query of <linux/fs.h> (Linux 6.11).
type procmapQuery struct {
	size, queryFlags, queryAddr   uint64
	vmaStart, vmaEnd, vmaFlags    uint64
	vmaPageSize, vmaOffset, inode uint64
	devMajor, devMinor            uint32
	vmaNameSize, buildIDSize      uint32
	vmaNameAddr, buildIDAddr      uint64
}

const (
	procmapQueryIoctl = 0xC0686611 // _IOWR('f', 17, struct procmap_query)
	// query_flags and vma_flags
	vmaReadable         = 0x01
	vmaWritable         = 0x02
	vmaExecutable       = 0x04
	vmaShared           = 0x08
	queryCoveringOrNext = 0x10
	queryFileBacked     = 0x20
)

var namePool = sync.Pool{New: func() any { return new([unix.PathMax + 16]byte) }}

// ExecFiles returns pid's executable, file-backed mappings, each as
// ReadExec would (path without " (deleted)", Deleted set). It asks the
// kernel for them one at a time (the PROCMAP_QUERY ioctl of
// /proc/PID/maps), which formats no line for the other mappings; on a
// kernel without it, it reads the maps as ReadExec does. A flip batch
// reads them twice (D62).
func ExecFiles(pid int) ([]Mapping, error) {
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/maps", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
			return nil, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
		}
		return nil, fmt.Errorf("/proc/%d/maps: %w", pid, err)
	}
	defer unix.Close(fd)
	var out []Mapping
	// The kernel writes the name at an address passed as a number: the
	// buffer is from the heap (a pool), which does not move, not from a
	// stack that could.
	name := namePool.Get().(*[unix.PathMax + 16]byte)
	defer namePool.Put(name)
	for addr := uint64(0); ; {
		q := procmapQuery{
			size:        uint64(unsafe.Sizeof(procmapQuery{})),
			queryFlags:  queryCoveringOrNext | queryFileBacked | vmaExecutable,
			queryAddr:   addr,
			vmaNameSize: uint32(len(name)),
			vmaNameAddr: uint64(uintptr(unsafe.Pointer(&name[0]))),
		}
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), procmapQueryIoctl, uintptr(unsafe.Pointer(&q)))
		runtime.KeepAlive(name)
		switch {
		case e == unix.ENOENT: // no mapping at or after addr
			return out, nil
		case e == unix.ENOTTY || e == unix.EINVAL || e == unix.ENAMETOOLONG:
			// No PROCMAP_QUERY (before Linux 6.11), or a name longer than
			// a path: the text.
			return execFilesText(pid)
		case e == unix.ESRCH:
			return nil, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
		case e != 0:
			return nil, fmt.Errorf("/proc/%d/maps: PROCMAP_QUERY: %w", pid, e)
		}
		m := Mapping{Start: q.vmaStart, End: q.vmaEnd, Offset: q.vmaOffset, Inode: q.inode,
			Perms: perms(q.vmaFlags), Dev: fmt.Sprintf("%02x:%02x", q.devMajor, q.devMinor)}
		if q.vmaNameSize > 0 {
			m.Path = string(name[:q.vmaNameSize-1]) // vma_name_size counts the NUL
		}
		if p, ok := strings.CutSuffix(m.Path, " (deleted)"); ok && m.Inode != 0 {
			m.Path, m.Deleted = p, true
		}
		out = append(out, m)
		if q.vmaEnd <= addr {
			return nil, fmt.Errorf("/proc/%d/maps: PROCMAP_QUERY went back from %#x to %#x", pid, addr, q.vmaEnd)
		}
		addr = q.vmaEnd
	}
}

// execFilesText is ExecFiles from the maps' text.
func execFilesText(pid int) ([]Mapping, error) {
	ms, err := ReadExec(pid)
	if err != nil {
		return nil, err
	}
	out := ms[:0]
	for _, m := range ms {
		if m.Inode != 0 && m.Path != "" && !strings.HasPrefix(m.Path, "[") {
			out = append(out, m)
		}
	}
	return out, nil
}

// perms is the maps file's permissions field ("r-xp") for vma_flags.
func perms(f uint64) string {
	b := []byte("---p")
	if f&vmaReadable != 0 {
		b[0] = 'r'
	}
	if f&vmaWritable != 0 {
		b[1] = 'w'
	}
	if f&vmaExecutable != 0 {
		b[2] = 'x'
	}
	if f&vmaShared != 0 {
		b[3] = 's'
	}
	return string(b)
}

// Maps is pid's /proc/PID/maps held open, to ask the kernel which mapping
// covers an address (PROCMAP_QUERY) without formatting the whole text. An
// open maps file stays bound to the address space it was opened on: once
// the process runs exec or exits, Covering returns ErrNoProcess.
type Maps struct {
	pid, fd int
	text    bool // no PROCMAP_QUERY: every Covering reads the text
}

// OpenMaps opens pid's maps for Covering.
func OpenMaps(pid int) (*Maps, error) {
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/maps", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
			return nil, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
		}
		return nil, fmt.Errorf("/proc/%d/maps: %w", pid, err)
	}
	return &Maps{pid: pid, fd: fd}, nil
}

// Queries reports whether Covering asks the kernel for one mapping
// (PROCMAP_QUERY, Linux 6.11) rather than reading the whole text.
func (m *Maps) Queries() bool { return !m.text }

// Covering returns the mapping that holds addr (Path left empty), or
// ok=false when nothing is mapped there.
func (m *Maps) Covering(addr uint64) (mp Mapping, ok bool, err error) {
	if !m.text {
		q := procmapQuery{size: uint64(unsafe.Sizeof(procmapQuery{})), queryAddr: addr}
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(m.fd), procmapQueryIoctl, uintptr(unsafe.Pointer(&q)))
		switch {
		case e == 0:
			return Mapping{Start: q.vmaStart, End: q.vmaEnd, Offset: q.vmaOffset, Inode: q.inode,
				Perms: perms(q.vmaFlags), Dev: fmt.Sprintf("%02x:%02x", q.devMajor, q.devMinor)}, true, nil
		case e == unix.ENOENT:
			return Mapping{}, false, nil
		case e == unix.ESRCH:
			return Mapping{}, false, fmt.Errorf("pid %d: %w", m.pid, ErrNoProcess)
		case e == unix.ENOTTY || e == unix.EINVAL:
			m.text = true
		default:
			return Mapping{}, false, fmt.Errorf("/proc/%d/maps: PROCMAP_QUERY: %w", m.pid, e)
		}
	}
	ms, err := Read(m.pid)
	if err != nil {
		return Mapping{}, false, err
	}
	for _, x := range ms {
		if addr >= x.Start && addr < x.End {
			x.Path, x.Deleted = "", false
			return x, true, nil
		}
	}
	return Mapping{}, false, nil
}

// Close closes the maps file.
func (m *Maps) Close() error { return unix.Close(m.fd) }
