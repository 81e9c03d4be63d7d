package cli

import (
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/perfetto"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
)

// atomicOutput is a file written under a temporary name in its directory
// and renamed into place by commit, so a failed or interrupted command
// never leaves a half-written file. It gets 0644 less the user's umask,
// as a file the shell's redirection made would.
type atomicOutput struct {
	f    *os.File
	e    *procfs.Entry // where: the directory by descriptor (D99)
	tmp  string        // the temporary's name there
	path string
	done bool
}

// createAtomic looks path up with procfs.Walk (another user's link in /tmp
// on the way is refused) and makes the temporary by descriptor in the
// directory found, where commit renames it: a directory of the path
// swapped for a link meanwhile redirects neither (D99).
func createAtomic(path string) (*atomicOutput, error) {
	e, err := procfs.Walk(path)
	if err != nil {
		return nil, err
	}
	f, tmp, err := e.CreateTemp()
	if err != nil {
		e.Close()
		return nil, err
	}
	return &atomicOutput{f: f, e: e, tmp: tmp, path: path}, nil
}

func (a *atomicOutput) Write(p []byte) (int, error) { return a.f.Write(p) }

func (a *atomicOutput) commit() error {
	for _, step := range []func() error{func() error { return a.f.Chmod(0o644 &^ procfs.Umask()) }, a.f.Sync, a.f.Close} {
		if err := step(); err != nil {
			return fmt.Errorf("%s: %w", a.path, err)
		}
	}
	if err := a.e.Replace(a.tmp); err != nil {
		return err
	}
	a.done = true
	a.e.Close()
	return nil
}

// abort removes the temporary file unless commit succeeded.
func (a *atomicOutput) abort() {
	if !a.done {
		a.f.Close()
		a.e.RemoveTemp(a.tmp)
		a.e.Close()
		a.done = true
	}
}

// clockReading reads CLOCK_MONOTONIC (the runtime's timestamps) and
// CLOCK_BOOTTIME (Perfetto's default trace clock) together.
func clockReading() *perfetto.Clocks {
	var mono, boot unix.Timespec
	if unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono) != nil || unix.ClockGettime(unix.CLOCK_BOOTTIME, &boot) != nil {
		return nil
	}
	return &perfetto.Clocks{MonotonicNs: uint64(mono.Nano()), BoottimeNs: uint64(boot.Nano())}
}

// processName is the process's command name, or "" if it is gone.
func processName(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(b))
}

// threadComm names a thread for its track: its command name and id.
func threadComm(pid int, tid int32) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/comm", pid, tid))
	if err != nil {
		return fmt.Sprintf("thread %d", tid)
	}
	return fmt.Sprintf("%s %d", strings.TrimSpace(string(b)), tid)
}

// guardMapped makes a fault of a file mapping read in this goroutine (a
// SIGBUS: the file was truncated under the mapping) an error in *err, one
// line, instead of a crash; call it deferred, as defer guardMapped(p, &err)().
//
// `stats --input FILE` maps FILE, which its owner (another user: a service's
// output read by root) can truncate while it is read: review6 had `hotpatch
// stats --input` die with "fatal error: fault [signal SIGBUS ...]" and a
// goroutine dump in 15 of 400 runs while the file was rewritten. The live
// region cannot shrink (sealed, D16); a file can.
func guardMapped(path string, err *error) func() {
	old := debug.SetPanicOnFault(true)
	return func() {
		r := recover()
		debug.SetPanicOnFault(old)
		if r == nil {
			return
		}
		if f, ok := r.(interface{ Addr() uintptr }); ok {
			*err = fmt.Errorf("%s: the file shrank while it was read (its owner truncated or rewrote it; fault at %#x)", path, f.Addr())
			return
		}
		panic(r)
	}
}
