package procfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// ErrPlantedLink: a path reaches its file through a symbolic link that
// another user owns in a sticky directory everyone may write (/tmp), which
// the kernel's fs.protected_symlinks would not follow either (it is often
// off). Root following it reads or rewrites whatever the link's owner
// pointed it at (coldpatch BINARY, hotpatch --commands FILE: review7).
var ErrPlantedLink = errors.New("symbolic link owned by another user in a sticky world-writable directory")

// CheckLinks follows path's symbolic links as the kernel does and refuses
// one that fs.protected_symlinks would refuse: in a sticky, world-writable
// directory, owned neither by us nor by the directory's owner. Errors of
// the walk itself are left to the open that follows. (A link swapped in
// after this walk, before the open, is followed: the kernel's own rule,
// where it is on, closes that window.)
func CheckLinks(path string) error {
	p, err := filepath.Abs(path)
	if err != nil {
		return nil
	}
	for hops := 0; hops < 40 && filepath.IsAbs(p); hops++ {
		parts := strings.Split(p, "/")[1:]
		cur, link := "/", -1
		var fi os.FileInfo
		for i, part := range parts {
			next := filepath.Join(cur, part)
			var err error
			if fi, err = os.Lstat(next); err != nil {
				return nil
			}
			if fi.Mode()&os.ModeSymlink != 0 {
				link = i
				break
			}
			cur = next
		}
		if link < 0 {
			return nil
		}
		name := filepath.Join(cur, parts[link])
		if dir, err := os.Stat(cur); err == nil {
			if uid, theirs := OthersInSticky(dir, fi); theirs {
				return fmt.Errorf("%s: %w (uid %d): not followed, as fs.protected_symlinks would not; name the file itself", name, ErrPlantedLink, uid)
			}
		}
		target, err := os.Readlink(name)
		if err != nil {
			return nil
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(cur, target)
		}
		p = filepath.Join(append([]string{target}, parts[link+1:]...)...)
	}
	return nil
}

// OthersInSticky reports whether f, an entry of the directory dir, belongs
// to another user in a sticky directory everyone may write (/tmp): owned
// neither by us (the effective uid) nor by the directory's owner. It is the
// kernel's rule for fs.protected_symlinks and protected_regular (often
// off), which root's tools keep themselves. uid is f's owner.
func OthersInSticky(dir, f os.FileInfo) (uid uint32, theirs bool) {
	fs, ok1 := f.Sys().(*syscall.Stat_t)
	ds, ok2 := dir.Sys().(*syscall.Stat_t)
	if !ok1 || !ok2 {
		return 0, false
	}
	return fs.Uid, dir.Mode()&os.ModeSticky != 0 && dir.Mode().Perm()&0o002 != 0 &&
		int(fs.Uid) != os.Geteuid() && fs.Uid != ds.Uid
}
