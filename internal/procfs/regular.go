package procfs

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// ErrNotRegular: OpenRegular's path names something other than a regular
// file (a FIFO, a device, a socket, a directory).
var ErrNotRegular = errors.New("not a regular file")

// OpenRegular opens path for reading only if it is a regular file, and
// runs no other kind of file's open: the path is looked up with O_PATH
// (which opens nothing: a FIFO does not wait, a device's open is not
// called), the file found is checked with fstat, and that very file is
// then opened through our own /proc/self/fd link (O_NONBLOCK: a file under
// a lease fails at once rather than waiting; O_NOCTTY). The path may be
// another user's to change between any two steps: what is opened is the
// file checked.
//
// review6 (D88): paths hotpatch opens as root that another user writes (the
// maps copy in an exited process's output file, a mapped object's path
// when map_files fails) could name a FIFO (the open waited forever) or,
// through a symbolic link, any device (whose open has its own effects).
func OpenRegular(path string) (*os.File, error) {
	return OpenRegularFile(path, unix.O_RDONLY)
}

// OpenRegularFile is OpenRegular with the access mode flag (O_RDONLY,
// O_WRONLY or O_RDWR).
func OpenRegularFile(path string, flag int) (*os.File, error) {
	e, err := Walk(path)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	return e.openRegular(path, flag)
}

// OpenRegular opens the file Walk found, as OpenRegularFile does: only a
// regular file, through our /proc/self/fd link to the very file checked.
func (e *Entry) OpenRegular(flag int) (*os.File, error) { return e.openRegular(e.Path, flag) }

func (e *Entry) openRegular(path string, flag int) (*os.File, error) {
	if e.File < 0 {
		return nil, &os.PathError{Op: "open", Path: path, Err: unix.ENOENT}
	}
	var st unix.Stat_t
	if err := unix.Fstat(e.File, &st); err != nil {
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%s: %w (mode %#o)", path, ErrNotRegular, st.Mode&unix.S_IFMT)
	}
	return reopen(path, e.File, flag&unix.O_ACCMODE|unix.O_NONBLOCK)
}

// lookup finds path with Walk (O_PATH, which opens nothing: a FIFO does not
// wait, a device's open is not called; links checked on the way, D99), and
// fstats what it found.
func lookup(path string) (int, unix.Stat_t, error) {
	var st unix.Stat_t
	e, err := Walk(path)
	if err != nil {
		return -1, st, err
	}
	pfd := e.File
	e.File = -1
	e.Close()
	if pfd < 0 {
		return -1, st, &os.PathError{Op: "open", Path: path, Err: unix.ENOENT}
	}
	if err := unix.Fstat(pfd, &st); err != nil {
		unix.Close(pfd)
		return -1, st, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	return pfd, st, nil
}

// reopen opens the very file lookup found, through our own /proc/self/fd
// link to it (which nothing else can change), with flag.
func reopen(path string, pfd, flag int) (*os.File, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), flag|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// ErrNotOwned: OpenOwned's path names a file another user owns.
var ErrNotOwned = errors.New("owned by another user")

// OpenOwned opens path for reading if it is a regular file or a FIFO owned
// by us (the effective uid) or by root, and runs no open of anything else:
// looked up with O_PATH (a FIFO does not wait yet, a device's open is not
// called), checked with fstat, then that very file opened through our own
// /proc/self/fd link (a FIFO's open then waits for its writer, as a FIFO
// named on purpose should).
//
// It is for files whose content says what we do as root: `hotpatch
// --commands FILE` (D93). Another user's file there (a FIFO or a file
// planted in /tmp, or a link to one: fs.protected_symlinks and
// protected_fifos are often off) would choose which probes root turns on
// in the process named, or hold it in the open forever.
func OpenOwned(path string) (*os.File, error) {
	// A link another user planted in /tmp to a file of root's would pass
	// the owner check below: not followed (Walk, in lookup).
	pfd, st, err := lookup(path)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pfd)
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG && t != unix.S_IFIFO {
		return nil, fmt.Errorf("%s: %w nor a FIFO (mode %#o)", path, ErrNotRegular, t)
	}
	if euid := uint32(os.Geteuid()); st.Uid != euid && st.Uid != 0 {
		return nil, fmt.Errorf("%s: %w (uid %d): its content would choose what this hotpatch (uid %d) does", path, ErrNotOwned, st.Uid, euid)
	}
	return reopen(path, pfd, unix.O_RDONLY) // blocking: our own FIFO waits for its writer
}

// OpenInput opens path for reading if it is a regular file (anybody's),
// or a FIFO or pipe of ours or root's (`<(...)`, a FIFO we made), and runs
// no open of anything else: looked up by Walk (another user's link in
// /tmp is not followed), checked with fstat, then that very file opened
// (a FIFO of ours waits for its writer, as named on purpose).
//
// It is for files we only print (`hotpatch replay FILE`, D100): another
// user's regular file is data like any other, but their FIFO in /tmp held
// the command in the open forever, and a device (or a link to one) had its
// open called.
func OpenInput(path string) (*os.File, error) {
	pfd, st, err := lookup(path)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pfd)
	switch t := st.Mode & unix.S_IFMT; {
	case t == unix.S_IFREG:
		return reopen(path, pfd, unix.O_RDONLY|unix.O_NONBLOCK)
	case t != unix.S_IFIFO:
		return nil, fmt.Errorf("%s: %w nor a FIFO (mode %#o)", path, ErrNotRegular, t)
	}
	if euid := uint32(os.Geteuid()); st.Uid != euid && st.Uid != 0 {
		return nil, fmt.Errorf("%s: a FIFO %w (uid %d): its writer would hold this command (uid %d) in the open", path, ErrNotOwned, st.Uid, euid)
	}
	return reopen(path, pfd, unix.O_RDONLY)
}
