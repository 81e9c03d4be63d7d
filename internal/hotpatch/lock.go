package hotpatch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/procmaps"
)

// ErrBusy means another hotpatch holds the target's lock.
var ErrBusy = errors.New("another hotpatch is working on this process")

// lockDir holds the per-process lock files. /run/lock is a world-writable
// tmpfs on Debian; elsewhere fall back to the temporary directory.
func lockDir() string {
	if st, err := os.Stat("/run/lock"); err == nil && st.IsDir() {
		return "/run/lock"
	}
	return os.TempDir()
}

// Lock serialises hotpatch runs on one process: two patchers interleaving
// their reads and writes of the same sites could each verify a state the
// other is about to change. The lock file is named by pid and the process's
// start time, so a recycled pid never inherits a stale lock, and flock(2)
// releases it when we exit, however we exit.
type Lock struct{ f *os.File }

// AcquireLock takes the lock for pid; with wait it blocks until the holder
// finishes, without it a held lock is ErrBusy.
func AcquireLock(pid int, wait bool) (*Lock, error) {
	start, err := startTime(pid)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(lockDir(), fmt.Sprintf("edgeprobe-%d-%s.lock", pid, start))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	how := unix.LOCK_EX
	if !wait {
		how |= unix.LOCK_NB
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("pid %d: %w (use --wait to queue behind it)", pid, ErrBusy)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return &Lock{f: f}, nil
}

// Release drops the lock. The file stays: unlinking it could let a waiter
// hold a lock on an unlinked file while a newcomer locks a fresh one.
func (l *Lock) Release() {
	if l == nil || l.f == nil {
		return
	}
	l.f.Close()
	l.f = nil
}

// startTime returns field 22 of /proc/PID/stat: the process start time in
// clock ticks since boot, which with the pid identifies a process uniquely.
func startTime(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("pid %d: %w", pid, procmaps.ErrNoProcess)
		}
		return "", err
	}
	// The command name (field 2) may hold spaces and parentheses: split after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 20 {
		return "", fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return fields[19], nil // field 22 overall; fields[0] is field 3
}
