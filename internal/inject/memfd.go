package inject

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// fillMemfd writes the runtime into descriptor fd of pid, the memfd the
// load's memfd_create has just made there.
//
// The descriptor is the program's, and its other threads run meanwhile: it
// may already hold another file (a dup2 onto it). So it is never reopened
// by its /proc/PID/fd path, which opens whatever file the descriptor names
// now with hotpatch's credentials: as root, any file at all, since the
// program needs no permission on a file to name it (open with O_PATH).
// review5 found exactly that: a target run by another user had root's
// hotpatch truncate a root-only file and write the runtime into it (D82,
// TestLoadMemfdReplaced). Instead hotpatch takes the program's own open
// file (pidfd_getfd): a write through it is one the program could make
// itself, and it must be an empty memfd of the load's name, else nothing is
// written (ErrMemfdReplaced). Where pidfd_getfd is missing (Linux < 5.6) or
// refused, the path is opened, but only after and before checks of the
// same kind, without O_TRUNC, and a file other than the one checked is
// never written (memfdByPath).
func fillMemfd(pid, fd int, runtime []byte) error {
	f, err := memfdOf(pid, fd)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteAt(runtime, 0); err != nil {
		return fmt.Errorf("write the runtime into the target's memfd: %w", err)
	}
	return nil
}

// memfdOf returns the program's descriptor fd as a file of ours, checked to
// be the load's memfd (isOurMemfd).
func memfdOf(pid, fd int) (*os.File, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err == nil {
		var got int
		got, err = unix.PidfdGetfd(pidfd, fd, 0)
		unix.Close(pidfd)
		if err == nil {
			f := os.NewFile(uintptr(got), "memfd")
			if err := isOurMemfd(f, pid, fd); err != nil {
				f.Close()
				return nil, err
			}
			return f, nil
		}
	}
	if err == unix.ESRCH {
		return nil, fmt.Errorf("open the target's memfd: %w", err)
	}
	if err == unix.EBADF {
		// The program closed it: nothing to take, nothing written.
		return nil, fmt.Errorf("pid %d: descriptor %d is closed: %w", pid, fd, ErrMemfdReplaced)
	}
	return memfdByPath(pid, fd)
}

// memfdByPath is memfdOf without pidfd_getfd: /proc/PID/fd/N is checked
// (stat follows it to the file it names now), opened for writing without
// O_TRUNC, O_CREAT or a wait (O_NONBLOCK: a FIFO put there does not hold us),
// and what was opened must be the file checked, still an empty memfd of
// ours. A file put there between the check and the open is opened but
// never written.
func memfdByPath(pid, fd int) (*os.File, error) {
	path := fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
	var before unix.Stat_t
	if err := unix.Stat(path, &before); err != nil {
		return nil, fmt.Errorf("open the target's memfd: %w", err)
	}
	if err := memfdShape(&before, pid, fd, path); err != nil {
		return nil, err
	}
	got, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open the target's memfd: %w", err)
	}
	f := os.NewFile(uintptr(got), "memfd")
	var after unix.Stat_t
	if err := unix.Fstat(got, &after); err != nil || after.Dev != before.Dev || after.Ino != before.Ino {
		f.Close()
		return nil, fmt.Errorf("pid %d: descriptor %d changed while it was opened: %w", pid, fd, ErrMemfdReplaced)
	}
	if err := isOurMemfd(f, pid, fd); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// memfdName's link text: what /proc/PID/fd/N reads for the load's memfd.
const memfdLink = "/memfd:" + memfdName + " (deleted)"

// isOurMemfd checks that f, an open file of ours, is an empty memfd named
// as the load names its own (its link in /proc/self/fd: our descriptor,
// which nothing else can change).
func isOurMemfd(f *os.File, pid, fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("open the target's memfd: %w", err)
	}
	return memfdShape(&st, pid, fd, "/proc/self/fd/"+strconv.Itoa(int(f.Fd())))
}

// memfdShape checks st, the file that link names: a regular file, linked
// nowhere, empty, the link reading as the load's memfd.
func memfdShape(st *unix.Stat_t, pid, fd int, link string) error {
	name, err := os.Readlink(link)
	if err != nil {
		return fmt.Errorf("open the target's memfd: %w", err)
	}
	switch {
	case name != memfdLink:
		return fmt.Errorf("pid %d: descriptor %d holds %q, not the memfd the load made (nothing was written): %w", pid, fd, name, ErrMemfdReplaced)
	case st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 0 || st.Size != 0:
		return fmt.Errorf("pid %d: descriptor %d is a memfd of the load's name but not a new one (%d bytes, %d links; nothing was written): %w", pid, fd, st.Size, st.Nlink, ErrMemfdReplaced)
	}
	return nil
}
