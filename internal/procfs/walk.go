package procfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Entry is where Walk ended: Dir, the directory holding the path's last
// component, as an O_PATH descriptor; Name, that component; File, the file
// itself as an O_PATH descriptor, or -1 when no such entry exists (a file
// about to be created); Path, the path Walk followed (links resolved).
type Entry struct {
	Dir, File int
	Name      string
	Path      string
}

// Close closes both descriptors.
func (e *Entry) Close() {
	if e.File >= 0 {
		unix.Close(e.File)
	}
	unix.Close(e.Dir)
}

// Stat is os.Stat of the file Walk found (ENOENT when there is none).
func (e *Entry) Stat() (os.FileInfo, error) {
	if e.File < 0 {
		return nil, &os.PathError{Op: "stat", Path: e.Path, Err: unix.ENOENT}
	}
	return statFd(e.File, e.Path)
}

// DirStat is os.Stat of the directory Walk found the file in.
func (e *Entry) DirStat() (os.FileInfo, error) { return statFd(e.Dir, filepath.Dir(e.Path)) }

// statFd is os.Stat of an O_PATH descriptor, on a duplicate (the os.File
// made for it closes it).
func statFd(fd int, name string) (os.FileInfo, error) {
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "stat", Path: name, Err: err}
	}
	f := os.NewFile(uintptr(d), name)
	defer f.Close()
	return f.Stat()
}

// maxLinks is the kernel's bound on links followed in one lookup.
const maxLinks = 40

// Walk looks path up the way open(2) does, following its symbolic links,
// but one component at a time from the directory descriptor reached so far
// (openat with O_PATH|O_NOFOLLOW), so that what it checks is what it uses:
// a link is opened itself (O_PATH|O_NOFOLLOW), its owner and its
// directory's checked on those descriptors, its target read from that
// descriptor. A link another user owns in a sticky, world-writable
// directory (the rule of fs.protected_symlinks, which is often off) is
// ErrPlantedLink, whenever it appears: a swap of a directory for such a
// link between any two steps is either seen by the step or not followed.
// A missing last component is no error (File is -1); a missing directory
// is. Links inside /proc are left to the kernel (magic links such as
// /proc/self/fd/N name no path; nobody but the kernel writes there).
//
// D99: CheckLinks walked the path's links and the open then looked the
// path up again; a link swapped in between was followed (review7's gap).
func Walk(path string) (*Entry, error) {
	e, err := walk(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) || errors.Is(err, ErrPlantedLink) {
			return nil, err
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return e, nil
}

func walk(path string) (*Entry, error) {
	if path == "" {
		return nil, unix.ENOENT
	}
	start, cur := ".", ""
	if filepath.IsAbs(path) {
		start, cur = "/", "/"
	} else if wd, err := os.Getwd(); err == nil {
		cur = wd
	}
	dir, err := openPath(unix.AT_FDCWD, start, unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	ok := false
	name, file := ".", -1
	defer func() {
		if !ok {
			unix.Close(dir)
			if file >= 0 {
				unix.Close(file)
			}
		}
	}()
	rest := split(path)
	if len(rest) == 0 { // "/" itself
		rest = []string{"."}
	}
	mustDir := strings.HasSuffix(path, "/")
	links := 0
	for len(rest) > 0 {
		part := rest[0]
		rest = rest[1:]
		if file >= 0 { // the previous component was not the last: it is a directory now
			unix.Close(dir)
			dir, file = file, -1
			cur = filepath.Join(cur, name)
		}
		if part == "." {
			name = "."
			fd, err := openPath(dir, ".", 0)
			if err != nil {
				return nil, err
			}
			file = fd
			continue
		}
		name = part
		fd, err := openPath(dir, part, unix.O_NOFOLLOW)
		if err == unix.ENOENT && len(rest) == 0 {
			break // a last component to create
		}
		if err != nil {
			return nil, err
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return nil, err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			file = fd
			if len(rest) > 0 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return nil, unix.ENOTDIR
			}
			continue
		}
		if links++; links > maxLinks {
			unix.Close(fd)
			return nil, unix.ELOOP
		}
		var dst unix.Stat_t
		if err := unix.Fstat(dir, &dst); err != nil {
			unix.Close(fd)
			return nil, err
		}
		at := filepath.Join(cur, part)
		if uid, theirs := othersInSticky(&dst, &st); theirs {
			unix.Close(fd)
			return nil, fmt.Errorf("%s: %w (uid %d): not followed, as fs.protected_symlinks would not; name the file itself", at, ErrPlantedLink, uid)
		}
		var fs unix.Statfs_t
		if unix.Fstatfs(dir, &fs) == nil && fs.Type == unix.PROC_SUPER_MAGIC {
			// /proc's links: the kernel's to follow (magic links name
			// no path), and nobody else's to change.
			target, _ := readlinkFd(fd)
			unix.Close(fd)
			if fd, err = openPath(dir, part, 0); err != nil {
				return nil, err
			}
			file = fd
			if filepath.IsAbs(target) { // a path, not "pipe:[N]": for Path
				cur, name = filepath.Dir(target), filepath.Base(target)
			}
			continue
		}
		target, err := readlinkFd(fd)
		unix.Close(fd)
		if err != nil {
			return nil, err
		}
		rest = append(split(target), rest...)
		if strings.HasPrefix(target, "/") {
			unix.Close(dir)
			if dir, err = openPath(unix.AT_FDCWD, "/", unix.O_DIRECTORY); err != nil {
				dir = -1
				return nil, err
			}
			cur = "/"
		}
		if len(rest) == 0 { // a link to "/" or "."
			rest = []string{"."}
		}
	}
	if file >= 0 && mustDir {
		var st unix.Stat_t
		if err := unix.Fstat(file, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			unix.Close(file)
			return nil, unix.ENOTDIR
		}
	}
	ok = true
	return &Entry{Dir: dir, File: file, Name: name, Path: filepath.Join(cur, name)}, nil
}

// split returns path's components, empty ones dropped ("a//b/" is a, b).
func split(path string) []string {
	var parts []string
	for _, p := range strings.Split(path, "/") {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return parts
}

func openPath(dir int, name string, flag int) (int, error) {
	for {
		fd, err := unix.Openat(dir, name, unix.O_PATH|unix.O_CLOEXEC|flag, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// readlinkFd reads the target of the link fd (an O_PATH|O_NOFOLLOW
// descriptor of the link itself): the link checked, not a name that may
// have been swapped since.
func readlinkFd(fd int) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(fd, "", buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// othersInSticky is OthersInSticky on stat results.
func othersInSticky(dir, f *unix.Stat_t) (uint32, bool) {
	return f.Uid, dir.Mode&unix.S_ISVTX != 0 && dir.Mode&0o002 != 0 &&
		int(f.Uid) != os.Geteuid() && f.Uid != dir.Uid
}
