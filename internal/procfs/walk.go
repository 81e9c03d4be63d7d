package procfs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
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

// CreateTemp makes a new file in the directory Walk found, named
// "."+Name+".tmp"+random (O_EXCL|O_NOFOLLOW, mode 0600), for Replace to
// put over Name: an atomic write by descriptor, which a directory of the
// path swapped for a link meanwhile does not redirect (D99). It returns the
// file and its name in that directory.
func (e *Entry) CreateTemp() (*os.File, string, error) {
	prefix := "." + e.Name + ".tmp"
	var b [4]byte
	for try := 0; ; try++ {
		if _, err := rand.Read(b[:]); err != nil {
			return nil, "", err
		}
		name := prefix + hex.EncodeToString(b[:])
		fd, err := unix.Openat(e.Dir, name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == unix.EINTR || err == unix.EEXIST && try < 100 {
			continue
		}
		if err != nil {
			return nil, "", &os.PathError{Op: "create", Path: filepath.Join(filepath.Dir(e.Path), prefix+"*"), Err: err}
		}
		return os.NewFile(uintptr(fd), filepath.Join(filepath.Dir(e.Path), name)), name, nil
	}
}

// Replace renames tmp (a name CreateTemp made) over Name, in the directory
// Walk found.
func (e *Entry) Replace(tmp string) error {
	if err := unix.Renameat(e.Dir, tmp, e.Dir, e.Name); err != nil {
		return &os.LinkError{Op: "rename", Old: filepath.Join(filepath.Dir(e.Path), tmp), New: e.Path, Err: err}
	}
	return nil
}

// RemoveTemp removes tmp from the directory Walk found (best effort).
func (e *Entry) RemoveTemp(tmp string) { _ = unix.Unlinkat(e.Dir, tmp, 0) }

// SyncDir flushes the directory Walk found (a rename's durability; best
// effort).
func (e *Entry) SyncDir() {
	if d, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(e.Dir), unix.O_RDONLY|unix.O_DIRECTORY, 0); err == nil {
		_ = d.Sync()
		d.Close()
	}
}
