package procfs

import (
	"errors"
	"os"
	"syscall"
)

// ErrPlantedLink: a path reaches its file through a symbolic link that
// another user owns in a sticky directory everyone may write (/tmp), which
// the kernel's fs.protected_symlinks would not follow either (it is often
// off). Root following it reads or rewrites whatever the link's owner
// pointed it at (coldpatch BINARY, hotpatch --commands FILE: review7).
var ErrPlantedLink = errors.New("symbolic link owned by another user in a sticky world-writable directory")

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
