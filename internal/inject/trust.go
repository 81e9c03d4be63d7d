package inject

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/edgeprobe/edgeprobe/internal/elfsafe"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
)

// ReadRuntime opens the runtime file for a target owned by uid, refuses it
// unless it is trusted, and returns its contents. Trusted: a regular file
// owned by root or by uid, writable by nobody else (no group or other write
// bit), in a directory nobody else may write to either (else the file could
// be swapped between this check and the read: the read is from the checked
// descriptor, so only the contents' origin matters). It must be an x86-64
// shared object that defines every hook.
//
// Only a regular file is opened (procfs.OpenRegular): the path may be in a
// sticky directory such as /tmp, where another user can put a FIFO (whose
// open waited forever, the target's lock held) or a link to a device (whose
// open ran) before the checks below refused it (review7).
func ReadRuntime(path string, uid int) ([]byte, error) {
	e, err := procfs.Walk(path)
	if err != nil {
		return nil, fmt.Errorf("runtime %s: %w", path, err)
	}
	defer e.Close()
	f, err := e.OpenRegular(os.O_RDONLY)
	if errors.Is(err, procfs.ErrNotRegular) {
		return nil, fmt.Errorf("runtime %s: not a regular file: %w", path, ErrUntrusted)
	}
	if err != nil {
		return nil, fmt.Errorf("runtime %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("runtime %s: %w", path, err)
	}
	if err := trusted(path, st, uid); err != nil {
		return nil, err
	}
	// The directory the file was found in, by descriptor (D99): a path
	// looked up again could name another directory by now. The directory
	// of the path as given (its last component may be a link) is checked
	// too.
	for _, stat := range []func() (os.FileInfo, error){e.DirStat, func() (os.FileInfo, error) { return os.Stat(filepath.Dir(path)) }} {
		if dst, err := stat(); err == nil {
			if err := trustedDir(path, dst, uid); err != nil {
				return nil, err
			}
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("runtime %s: %w", path, err)
	}
	ef, err := elfsafe.NewFile(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("runtime %s: %v: %w", path, err, ErrNotRuntime)
	}
	if ef.Machine != elf.EM_X86_64 || ef.Type != elf.ET_DYN {
		return nil, fmt.Errorf("runtime %s: not an x86-64 shared object: %w", path, ErrNotRuntime)
	}
	syms, _ := ef.DynamicSymbols()
	have := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF {
			have[s.Name] = true
		}
	}
	for _, h := range Hooks {
		if !have[h] {
			return nil, fmt.Errorf("runtime %s does not define %s: %w", path, h, ErrNotRuntime)
		}
	}
	return b, nil
}

func trusted(path string, st os.FileInfo, uid int) error {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("runtime %s: no owner information: %w", path, ErrUntrusted)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("runtime %s: not a regular file: %w", path, ErrUntrusted)
	}
	if sys.Uid != 0 && int(sys.Uid) != uid {
		return fmt.Errorf("runtime %s is owned by uid %d, neither root nor the target's owner (uid %d): %w", path, sys.Uid, uid, ErrUntrusted)
	}
	if st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("runtime %s is writable by group or others (mode %v): %w", path, st.Mode().Perm(), ErrUntrusted)
	}
	return nil
}

func trustedDir(path string, st os.FileInfo, uid int) error {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	sticky := st.Mode()&os.ModeSticky != 0
	if st.Mode().Perm()&0o022 != 0 && !sticky {
		return fmt.Errorf("runtime %s: its directory is writable by group or others (mode %v), so the file could be replaced: %w", path, st.Mode().Perm(), ErrUntrusted)
	}
	if sys.Uid != 0 && int(sys.Uid) != uid {
		return fmt.Errorf("runtime %s: its directory is owned by uid %d, neither root nor the target's owner: %w", path, sys.Uid, ErrUntrusted)
	}
	return nil
}
