package probelist

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
)

// MaxFileBytes bounds a probe list file: coldpatch writes about 400 bytes
// a probe, so this is some 2.6 million probes, beyond any program's entry
// and exit sites we know of, and a read that root's hotpatch can afford.
const MaxFileBytes = 1 << 30

// OpenFile opens the probe list at path for reading, refusing (ErrFormat,
// one line) anything but a regular file of at most MaxFileBytes: it
// returns the file and a reader of exactly its size at the open.
//
// The path is the user's, but the file may be another's (a list written
// beside another user's program, in a directory that user can change):
// review6 found `--probes /dev/zero` grew root's hotpatch by 3 GB in 22 s,
// while it held the target's tracer, and a FIFO held it forever (D88). The
// open neither waits (O_NONBLOCK: a FIFO without a writer, a file under a
// lease) nor takes a terminal (O_NOCTTY); the size is the file's at the
// open, so a file growing meanwhile is read no further.
func OpenFile(path string) (*os.File, io.Reader, error) {
	// Looked up by procfs.Walk and checked before anything is opened (D88's
	// rule, as procfs.OpenRegular: a device's open has effects of its own;
	// another user's link in /tmp is not followed, D99), then that very
	// file opened.
	e, err := procfs.Walk(path)
	if err != nil {
		return nil, nil, err
	}
	defer e.Close()
	if e.File < 0 {
		return nil, nil, &os.PathError{Op: "open", Path: path, Err: unix.ENOENT}
	}
	var st unix.Stat_t
	if err := unix.Fstat(e.File, &st); err != nil {
		return nil, nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, nil, fmt.Errorf("%s: %w: not a regular file (%s); a probe list is read from a file", path, ErrFormat, fileKind(st.Mode))
	case st.Size > MaxFileBytes:
		return nil, nil, fmt.Errorf("%s: %w: %d bytes, more than any probe list (at most %d)", path, ErrFormat, st.Size, MaxFileBytes)
	}
	f, err := e.OpenRegular(unix.O_RDONLY)
	if err != nil {
		return nil, nil, err
	}
	// The size is the file's at the check: a file growing meanwhile is
	// read no further.
	return f, io.LimitReader(f, st.Size), nil
}

func fileKind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFDIR:
		return "a directory"
	}
	return fmt.Sprintf("mode %#o", mode&unix.S_IFMT)
}
