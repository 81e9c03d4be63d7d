package shm

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Errors of takeFD besides the system's.
var (
	// errGone: the descriptor was closed (or the process ended) before it
	// could be taken: nothing was opened.
	errGone = errors.New("descriptor closed")
	// errNotMemfd: the descriptor holds a file that is not a region memfd
	// (another file put on its number since its link was read).
	errNotMemfd = errors.New("not a region memfd")
)

// isRegionLink reports whether a /proc fd link names a region memfd.
func isRegionLink(link string) bool {
	return link == MemfdName || strings.HasPrefix(link, MemfdName+" ")
}

// takeFD returns descriptor fd of process pid as an open file of ours,
// checked to be a memfd of the runtime's name, without ever opening a path.
//
// The descriptor belongs to a program whose threads run meanwhile: between
// the read of its /proc/PID/fd link and any use of it, the program can dup2
// another file onto the number. Opening /proc/PID/fd/N opens whatever it
// names at that moment, with hotpatch's credentials (root, usually): a file
// under a write lease (the open waits for the lease holder, up to
// fs.lease-break-time, 45 s), a FIFO, a device (whatever its open does).
// review6 (R6-1, D86): so the program's own open file is taken with
// pidfd_getfd, as the runtime load takes its memfd (D82), and checked
// (its link in our /proc/self/fd, which nothing else can change: a memfd
// of the runtime's name, linked nowhere, a regular file) before anything
// else is asked of it. Taking a file runs no open: no lease is broken, no
// FIFO waits, no device sees an open. Where pidfd_getfd is missing (Linux <
// 5.6) or refused, takeByPath checks the path before it opens it and opens
// it without waiting (O_NONBLOCK).
func takeFD(pid, fd int) (*os.File, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err == unix.EINVAL || err == unix.ENOENT {
		// pid is a thread, not a process (ENOENT on Linux 6.9 and later,
		// EINVAL before): the live thread hotpatch works through when the
		// process's main thread has exited (D95). Its descriptor table is
		// the process's; PIDFD_THREAD (Linux 6.9) names it, else the path
		// below does.
		pidfd, err = unix.PidfdOpen(pid, pidfdThread)
		if err == unix.EINVAL {
			return takeByPath(pid, fd)
		}
	}
	if err == nil {
		var got int
		got, err = unix.PidfdGetfd(pidfd, fd, 0)
		unix.Close(pidfd)
		if err == nil {
			f := os.NewFile(uintptr(got), fmt.Sprintf("/proc/%d/fd/%d", pid, fd))
			if err := isRegionFile(f); err != nil {
				f.Close()
				return nil, err
			}
			return f, nil
		}
	}
	switch {
	case err == unix.EBADF || err == unix.ESRCH:
		return nil, errGone
	case err == unix.ENOSYS || err == unix.EPERM || err == unix.EACCES:
		return takeByPath(pid, fd)
	}
	return nil, err
}

// isRegionFile checks f, a file of ours: a regular file linked nowhere
// whose link reads as a region memfd. The seal and owner are checked by
// openTrusted.
func isRegionFile(f *os.File) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return err
	}
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(f.Fd())))
	if err != nil {
		return err
	}
	return regionShape(&st, link)
}

func regionShape(st *unix.Stat_t, link string) error {
	if !isRegionLink(link) || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 0 {
		return fmt.Errorf("%w (%q)", errNotMemfd, link)
	}
	return nil
}

// takeByPath is takeFD without pidfd_getfd: the file the path names is
// checked by stat (which opens nothing: no lease is broken, no FIFO or
// device is opened) to be a region memfd, then opened without waiting
// (O_NONBLOCK: a lease or a FIFO put there meanwhile fails the open rather
// than holding it; O_NOCTTY), and what was opened must be the file checked.
// Residual: a device put on the number between the stat and the open is
// opened (and at once closed).
func takeByPath(pid, fd int) (*os.File, error) {
	path := fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
	var before unix.Stat_t
	if err := unix.Stat(path, &before); err != nil {
		return nil, errGone
	}
	link, err := os.Readlink(path)
	if err != nil {
		return nil, errGone
	}
	if err := regionShape(&before, link); err != nil {
		return nil, err
	}
	flags := unix.O_CLOEXEC | unix.O_NOCTTY | unix.O_NONBLOCK
	got, err := unix.Open(path, unix.O_RDWR|flags, 0)
	if err != nil {
		got, err = unix.Open(path, unix.O_RDONLY|flags, 0)
		if err != nil {
			return nil, err
		}
	}
	f := os.NewFile(uintptr(got), path)
	var after unix.Stat_t
	if err := unix.Fstat(got, &after); err != nil || after.Dev != before.Dev || after.Ino != before.Ino {
		f.Close()
		return nil, fmt.Errorf("%w (changed while it was opened)", errNotMemfd)
	}
	return f, nil
}

// regionFiles calls fn with each descriptor of pid that holds a region
// memfd, taken as a file of ours (takeFD), in descriptor order, until fn
// returns true; fn does not own the file (it is closed after fn returns).
// Descriptors closed or replaced meanwhile are skipped; one that could not
// be taken otherwise is passed as its error (f nil). The returned error is
// non-nil only when the descriptors cannot be listed.
func regionFiles(pid int, fn func(f *os.File, fd int, err error) bool) error {
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// The link is read only to pass over the program's other files
		// without taking them; what is taken is checked again.
		if link, err := os.Readlink(fdDir + "/" + e.Name()); err != nil || !isRegionLink(link) {
			continue
		}
		f, err := takeFD(pid, fd)
		if errors.Is(err, errGone) || errors.Is(err, errNotMemfd) {
			continue
		}
		stop := fn(f, fd, err)
		if f != nil {
			f.Close()
		}
		if stop {
			break
		}
	}
	return nil
}

// pidfdThread is PIDFD_THREAD (O_EXCL): a pidfd of one thread.
const pidfdThread = unix.O_EXCL
