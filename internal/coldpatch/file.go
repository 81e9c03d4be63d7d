package coldpatch

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/elfscan"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
)

// ErrPlantedLink means BINARY is reached through a symbolic link that
// another user owns in a sticky directory everyone may write (/tmp):
// procfs.ErrPlantedLink.
var ErrPlantedLink = procfs.ErrPlantedLink

// ErrOthersOutput means the output file (-o) exists, in a sticky directory
// everyone may write (/tmp), and belongs to another user: replacing it
// would keep that user as the owner of root's cold binary (writeLike keeps
// an existing output's owner), so it is refused, as fs.protected_regular
// refuses root's O_CREAT of such a file.
var ErrOthersOutput = errors.New("output is another user's file in a sticky world-writable directory")

// ErrHardLinks means the file to rewrite in place has other hard links:
// replacing it (temp + rename) would leave them holding the old binary.
var ErrHardLinks = errors.New("file has other hard links")

// elfHeaderSize is the size of an ELF64 file header.
const elfHeaderSize = 64

// checkHeader reads only the ELF header and checks what the whole-file scan
// would reject first (magic, class, byte order, machine) and that the
// program and section header tables lie inside the file, so that a large
// file that is not an x86-64 ELF object fails before it is read (issue 11:
// a 3 GB non-ELF file took 394 s and 6.3 GB before "no ELF magic").
func checkHeader(f *os.File, size int64, path string) error {
	fail := func(kind error, where, format string, args ...any) error {
		return &elfscan.Error{Path: path, Where: where, Kind: kind, Detail: fmt.Sprintf(format, args...)}
	}
	h := make([]byte, elfHeaderSize)
	n, err := io.ReadFull(f, h)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return err
	}
	h = h[:n]
	if len(h) < 4 || string(h[:4]) != elf.ELFMAG {
		return fail(elfscan.ErrNotELF, "offset 0x0", "no ELF magic")
	}
	if len(h) < elfHeaderSize {
		return fail(elfscan.ErrTruncated, "offset 0x0", "%d bytes is shorter than an ELF64 header", len(h))
	}
	if elf.Class(h[elf.EI_CLASS]) != elf.ELFCLASS64 {
		return fail(elfscan.ErrNotX86_64, fmt.Sprintf("offset %#x", elf.EI_CLASS), "class %v", elf.Class(h[elf.EI_CLASS]))
	}
	if elf.Data(h[elf.EI_DATA]) != elf.ELFDATA2LSB {
		return fail(elfscan.ErrNotX86_64, fmt.Sprintf("offset %#x", elf.EI_DATA), "byte order %v", elf.Data(h[elf.EI_DATA]))
	}
	if m := elf.Machine(binary.LittleEndian.Uint16(h[18:])); m != elf.EM_X86_64 {
		return fail(elfscan.ErrNotX86_64, "offset 0x12", "machine %v", m)
	}
	le := binary.LittleEndian
	for _, tab := range []struct {
		name       string
		off        uint64
		num, entsz uint16
	}{
		{"program header table", le.Uint64(h[32:]), le.Uint16(h[56:]), le.Uint16(h[54:])},
		{"section header table", le.Uint64(h[40:]), le.Uint16(h[60:]), le.Uint16(h[58:])},
	} {
		end := tab.off + uint64(tab.num)*uint64(tab.entsz)
		if tab.num > 0 && (end < tab.off || end > uint64(size)) {
			return fail(elfscan.ErrTruncated, fmt.Sprintf("offset %#x", tab.off), "%s (%d entries of %d bytes) runs past the end of the %d-byte file", tab.name, tab.num, tab.entsz, size)
		}
	}
	return nil
}

// readChecked opens the file e found (path), checks its ELF header and only then reads it all.
// Only a regular file is opened (Entry.OpenRegular): a FIFO named as the
// binary (or put there, or linked there, by another user: coldpatch runs as
// root on build outputs) made the open wait for a writer forever, and a
// device had its open called, before the check that refused them.
func readChecked(e *procfs.Entry, path string) ([]byte, os.FileInfo, error) {
	f, err := e.OpenRegular(unix.O_RDONLY)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if err := checkHeader(f, st.Size(), path); err != nil {
		return nil, nil, err
	}
	data := make([]byte, st.Size())
	if _, err := f.ReadAt(data, 0); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return data, st, nil
}

// writeLike replaces path with data the way a careful strip does: a
// temporary file in the same directory, the original's owner and group
// (where we may: root), its mode including set-id bits (set after chown,
// which clears them), its extended attributes where the file system keeps
// them (file capabilities, security labels), fsync, rename over the
// original, fsync of the directory. Readers see the old file or the new
// one; a failure leaves the original untouched and no temporary behind.
//
// keepOwner is false for a new output file (-o), which belongs to whoever
// runs coldpatch and takes only the input's mode.
func writeLike(e *procfs.Entry, path string, data []byte, like os.FileInfo, keepOwner bool) error {
	// Everything happens in the directory Walk found (e.Dir), never by
	// path: a directory of the path swapped for a link meanwhile changes
	// nothing (D99).
	tmp, name, err := e.CreateTemp()
	if err != nil {
		return err
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			e.RemoveTemp(name)
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return err
	}
	if like != nil {
		if sys, ok := like.Sys().(*syscall.Stat_t); ok && keepOwner {
			if err := tmp.Chown(int(sys.Uid), int(sys.Gid)); err != nil && !errors.Is(err, os.ErrPermission) {
				return err
			}
		}
		mode := like.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)
		if err := tmp.Chmod(mode); err != nil {
			return err
		}
		if keepOwner && e.File >= 0 {
			copyXattrs("/proc/self/fd/"+strconv.Itoa(e.File), int(tmp.Fd()))
		}
	} else if err := tmp.Chmod(0o755); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := e.Replace(name); err != nil {
		e.RemoveTemp(name)
		done = true
		return err
	}
	done = true
	e.SyncDir() // the rename itself durable; best effort
	return nil
}

// copyXattrs copies every extended attribute of from onto fd, best effort:
// a file system without xattrs, or one we may not set (trusted.* as a user),
// is skipped. security.capability is copied after the chown above, which
// would otherwise have dropped it.
func copyXattrs(from string, fd int) {
	sz, err := unix.Listxattr(from, nil)
	if err != nil || sz <= 0 {
		return
	}
	buf := make([]byte, sz)
	sz, err = unix.Listxattr(from, buf)
	if err != nil {
		return
	}
	for _, name := range splitNul(buf[:sz]) {
		vsz, err := unix.Getxattr(from, name, nil)
		if err != nil || vsz < 0 {
			continue
		}
		val := make([]byte, vsz)
		if vsz, err = unix.Getxattr(from, name, val); err != nil {
			continue
		}
		_ = unix.Fsetxattr(fd, name, val[:vsz], 0)
	}
}

func splitNul(b []byte) []string {
	var out []string
	start := 0
	for i, c := range b {
		if c == 0 {
			if i > start {
				out = append(out, string(b[start:i]))
			}
			start = i + 1
		}
	}
	return out
}

// checkOutputOwner refuses an existing output that another user owns in a
// sticky, world-writable directory (ErrOthersOutput): owned neither by us
// nor by the directory's owner, the rule of fs.protected_regular
// (procfs.OthersInSticky).
func checkOutputOwner(e *procfs.Entry, out string, st os.FileInfo) error {
	dir, err := e.DirStat()
	if err != nil {
		return nil // the write that follows says why
	}
	if uid, theirs := procfs.OthersInSticky(dir, st); theirs {
		return fmt.Errorf("%s (uid %d): %w: not replaced; remove it or write elsewhere", out, uid, ErrOthersOutput)
	}
	return nil
}
