package procfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNoProcess: the pid (or thread id) names no process, or a kernel thread.
var ErrNoProcess = errors.New("no such process")

// ErrLeaderExited: the process's main thread has exited (pthread_exit in
// main) while other threads run on. ptrace cannot attach an exited thread,
// and /proc/PID/mem, maps and fd reach nothing through it: what works on
// such a process goes through another of its threads (Via, D95). It is not
// gone either.
var ErrLeaderExited = errors.New("its main thread has exited while its other threads run on")

// LeaderExited reports whether pid's main thread is a zombie while another
// of its threads runs on, not on its way out (ErrLeaderExited). A process
// exiting whole passes through the same picture for a moment (its main
// thread done, the others still dying): each of those has SIGKILL pending
// (the kernel's group exit sends it to every thread), or is a zombie
// itself, and does not count.
func LeaderExited(pid int) bool {
	st, err := ReadStat(pid, 0)
	if err != nil || st.State != 'Z' {
		return false
	}
	ents, err := os.ReadDir(path(pid, 0, "task"))
	if err != nil {
		return false
	}
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil || tid == pid {
			continue
		}
		ts, err := ReadStat(pid, tid)
		if err != nil || ts.State == 'Z' || ts.State == 'X' {
			continue
		}
		s, err := ReadStatus(pid, tid)
		if err == nil && s.SigMask("SigPnd")&(1<<(9-1)) == 0 { // SIGKILL
			return true
		}
	}
	return false
}

// path is /proc/PID/NAME, or /proc/PID/task/TID/NAME when tid > 0.
func path(pid, tid int, name string) string {
	if tid > 0 {
		return fmt.Sprintf("/proc/%d/task/%d/%s", pid, tid, name)
	}
	return fmt.Sprintf("/proc/%d/%s", pid, name)
}

func read(pid, tid int, name string) ([]byte, error) {
	b, err := ReadFile(path(pid, tid, name))
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) && !exists(pid) {
		return nil, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
	}
	return b, err
}

func exists(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err == nil
}

// Stat is the part of /proc/PID/stat edgeprobe reads.
type Stat struct {
	State     byte   // R, S, D, T, t, Z, X, ...
	Utime     uint64 // clock ticks
	Stime     uint64 // clock ticks
	StartTime uint64 // clock ticks since boot: with the pid, a process's identity
}

// ReadStat parses /proc/PID/stat (tid 0) or /proc/PID/task/TID/stat. The
// command name (field 2) may hold spaces and parentheses: fields are split
// after its last ')'.
func ReadStat(pid, tid int) (Stat, error) {
	b, err := read(pid, tid, "stat")
	if err != nil {
		return Stat{}, err
	}
	st, ok := parseStat(b)
	if !ok {
		return Stat{}, fmt.Errorf("%s: unexpected format", path(pid, tid, "stat"))
	}
	return st, nil
}

// parseStat parses a stat file's text; the process chooses its command
// name, spaces and parentheses included (FuzzParseStat).
func parseStat(b []byte) (Stat, bool) {
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return Stat{}, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, false
	}
	// f[0] is field 3 (state); utime, stime and starttime are 14, 15, 22.
	st := Stat{State: f[0][0]}
	st.Utime, _ = strconv.ParseUint(f[11], 10, 64)
	st.Stime, _ = strconv.ParseUint(f[12], 10, 64)
	st.StartTime, _ = strconv.ParseUint(f[19], 10, 64)
	return st, true
}

// Gone reports whether the process (or thread) no longer runs: absent, or
// a zombie.
func Gone(pid, tid int) bool {
	st, err := ReadStat(pid, tid)
	return err != nil || st.State == 'Z' || st.State == 'X'
}

// Zombie returns the one-line error for a process that has exited whose
// parent has not reaped it (a zombie: every thread gone), wrapping
// ErrNoProcess, or nil (it runs, or only its main thread exited, D95, or
// it does not exist: the caller's own error says so). The kernel answers
// such a process's ptrace attach and /proc/PID/mem with EPERM and ESRCH,
// which read as a permission problem (review8).
func Zombie(pid int) error {
	if st, err := ReadStat(pid, 0); err == nil && st.State == 'Z' && !LeaderExited(pid) {
		return fmt.Errorf("pid %d has exited (a zombie its parent has not reaped): %w", pid, ErrNoProcess)
	}
	return nil
}

// HasMemory reports whether the process has an address space: false once
// it is exiting (its memory is released before it becomes a zombie), or
// gone. A process that ran exec has one (the new program's). One whose maps
// we may not read is taken to have one.
func HasMemory(pid int) bool {
	f, err := Open(path(pid, 0, "maps"))
	if err != nil {
		return errors.Is(err, os.ErrPermission) && exists(pid)
	}
	defer f.Close()
	var b [1]byte
	n, _ := f.Read(b[:])
	return n == 1
}

// Status is /proc/PID/status as its "Key:\tvalue" lines.
type Status map[string]string

// ReadStatus parses /proc/PID/status (tid 0) or /proc/PID/task/TID/status.
func ReadStatus(pid, tid int) (Status, error) {
	b, err := read(pid, tid, "status")
	if err != nil {
		return nil, err
	}
	st := Status{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			st[k] = strings.TrimSpace(v)
		}
	}
	return st, nil
}

// Int returns a decimal field (TracerPid, Tgid, ...), or -1.
func (s Status) Int(key string) int {
	n, err := strconv.Atoi(s[key])
	if err != nil {
		return -1
	}
	return n
}

// SigMask returns a hexadecimal signal mask field (SigPnd, ShdPnd, ...).
func (s Status) SigMask(key string) uint64 {
	n, _ := strconv.ParseUint(s[key], 16, 64)
	return n
}

// TracerPid returns the thread id tracing tid of pid (0: none), or -1 when
// it cannot be read. /proc/TID works for any thread id, so pid may be tid.
func TracerPid(pid, tid int) int {
	st, err := ReadStatus(pid, tid)
	if err != nil {
		return -1
	}
	return st.Int("TracerPid")
}

// InnerPid is the process's pid in its own (innermost) pid namespace, the
// number getpid() returns inside it: the last field of NStgid (NSpid on
// kernels before 4.1), or pid itself
// when the kernel does not say.
func InnerPid(pid int) int {
	st, err := ReadStatus(pid, 0)
	if err != nil {
		return pid
	}
	// NStgid: the process's id, also when pid names one of its threads
	// (the live thread hotpatch works through once the main thread has
	// exited, D95); NSpid is that thread's own id.
	f := strings.Fields(st["NStgid"])
	if len(f) == 0 {
		f = strings.Fields(st["NSpid"])
	}
	if len(f) == 0 {
		return pid
	}
	n, err := strconv.Atoi(f[len(f)-1])
	if err != nil {
		return pid
	}
	return n
}

// SeccompThreads counts the threads of pid under seccomp (strict or filter
// mode, the Seccomp: field of each thread's status); when the thread list
// cannot be read, it answers 1 (unknown counts as sandboxed: the callers
// then avoid what a filter could kill the process for).
func SeccompThreads(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 1
	}
	n := 0
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := ReadStatus(pid, tid)
		if err != nil {
			continue // the thread ended
		}
		if st.Int("Seccomp") > 0 { // 1 strict, 2 filter; -1: a kernel without the field
			n++
		}
	}
	return n
}

// Open opens a regular file (a /proc file, a mapped object, a probe list)
// for reading as os.Open does, but without registering it with Go's
// network poller: os.Open tries every file there (two fcntl calls, an
// epoll_ctl that fails for a regular file, two more fcntl calls to undo
// it), and the first try sets the poller up, after which the scheduler
// polls it. A one-shot hotpatch opens a dozen such files (D71). Errors are
// os.Open's (*os.PathError wrapping the errno).
func Open(name string) (*os.File, error) {
	for {
		fd, err := syscall.Open(name, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: name, Err: err}
		}
		return os.NewFile(uintptr(fd), name), nil
	}
}

// ReadFile is os.ReadFile through Open.
func ReadFile(name string) ([]byte, error) {
	f, err := Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// Umask is this process's file mode creation mask, read from
// /proc/self/status (Linux 4.7 and later) rather than set and put back
// with umask(2), which would change it for every thread meanwhile. Where
// it cannot be read it is taken as 077: a file made private that should
// not have been is the safe mistake.
func Umask() os.FileMode {
	st, err := ReadStatus(os.Getpid(), 0)
	if err == nil {
		if v, err := strconv.ParseUint(strings.TrimSpace(st["Umask"]), 8, 32); err == nil {
			return os.FileMode(v) & os.ModePerm
		}
	}
	return 0o077
}

// CPUTime is how long thread tid of pid has run on a CPU: the first field
// of /proc/PID/task/TID/schedstat (ns, the scheduler's own sum), or, on a
// kernel without it, utime + stime of its stat (clock ticks of 10 ms, the
// USER_HZ every Linux reports them in). A capture tells with it a listed
// thread that made no traced call from one that did not run at all.
func CPUTime(pid, tid int) (time.Duration, error) {
	if b, err := read(pid, tid, "schedstat"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if ns, err := strconv.ParseUint(f[0], 10, 64); err == nil {
				return time.Duration(ns), nil
			}
		}
	}
	st, err := ReadStat(pid, tid)
	if err != nil {
		return 0, err
	}
	return time.Duration(st.Utime+st.Stime) * 10 * time.Millisecond, nil
}

// Via is the thread id through which /proc reaches pid's memory: pid
// itself, or, when its main thread has exited (LeaderExited), the lowest
// of its other live threads: /proc/TID/mem, maps and fd of a live thread
// reach the address space and the descriptor table the exited main
// thread's no longer do (D95). Such a thread may exit in turn: what is
// opened through it stays valid (the files hold the address space), a new
// open may need a new Via.
func Via(pid int) int {
	if !LeaderExited(pid) {
		return pid
	}
	ents, err := os.ReadDir(path(pid, 0, "task"))
	if err != nil {
		return pid
	}
	best := 0
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil || tid == pid || best != 0 && tid > best {
			continue
		}
		if ts, err := ReadStat(pid, tid); err == nil && ts.State != 'Z' && ts.State != 'X' {
			best = tid
		}
	}
	if best == 0 {
		return pid
	}
	return best
}
