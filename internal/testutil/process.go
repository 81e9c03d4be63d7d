package testutil

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
)

// Process is a fixture program running under a test. It follows the
// fixtures' protocol: the program prints "ready PID" once its threads run,
// and finishes when the stop file named by its first argument appears.
type Process struct {
	t        testing.TB
	Cmd      *exec.Cmd
	Pid      int
	StopFile string
	stdout   *bufio.Reader
	stderr   SyncBuffer
	done     chan error
}

// Start runs bin with a fresh stop file as its first argument, then extra
// args, and returns once the program has printed its ready line. The process
// is killed when the test ends, if it still runs.
func Start(t testing.TB, env []string, bin string, args ...string) *Process {
	t.Helper()
	return startWrapped(t, env, nil, bin, args...)
}

// StartPidNS is Start with the program in a pid namespace of its own, with
// its own /proc (`unshare -p -f --mount-proc`, as a container has): inside,
// it is pid 1 and its ready line says so; Pid is its pid outside, the one
// a tool outside the namespace is given. env is set inside.
func StartPidNS(t testing.TB, env []string, bin string, args ...string) *Process {
	t.Helper()
	RequireRoot(t, "unshares a pid namespace")
	RequireTool(t, "unshare")
	p := startWrapped(t, nil, append([]string{"unshare", "-p", "-f", "--kill-child", "--mount-proc", "env"}, env...), bin, args...)
	kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", p.Pid, p.Pid))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(kids)))
	if err != nil {
		t.Fatalf("unshare's child: %q", kids)
	}
	p.Pid = pid
	return p
}

// startWrapped runs wrapper... bin STOP args... (wrapper may be empty).
func startWrapped(t testing.TB, env, wrapper []string, bin string, args ...string) *Process {
	t.Helper()
	stop := filepath.Join(t.TempDir(), "stop")
	argv := append(append(append([]string(nil), wrapper...), bin, stop), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	// A test binary killed by its timeout (or by a developer) runs no
	// cleanup: without this its targets live on, orphaned, spinning on the
	// machine's two cores and slowing every later test.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// Our own pipe, not StdoutPipe: Wait (running from the start, below)
	// closes a StdoutPipe as soon as the process exits, which can lose the
	// last lines it wrote before we read them.
	out, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = w
	p := &Process{t: t, Cmd: cmd, StopFile: stop, stdout: bufio.NewReader(out), done: make(chan error, 1)}
	cmd.Stderr = &p.stderr
	err = StartCmd(cmd) // from the spawner thread: see spawn.go
	w.Close()
	if err != nil {
		out.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-p.done
		}
	})
	go func() { p.done <- cmd.Wait() }()
	line, err := p.stdout.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready ") {
		t.Fatalf("%s: want a ready line, got %q, %v (stderr %q)", bin, line, err, p.stderr.String())
	}
	p.Pid = cmd.Process.Pid
	return p
}

// Alive reports whether the process still runs (it may be a zombie waiting
// for us, which counts as dead).
func (p *Process) Alive() bool {
	return !procfs.Gone(p.Pid, 0)
}

// Finish creates the stop file and waits for the program to exit, failing
// the test if it does not exit cleanly within a minute. It returns the rest
// of stdout and all of stderr.
func (p *Process) Finish() (stdout, stderr string) {
	p.t.Helper()
	if err := os.WriteFile(p.StopFile, nil, 0o644); err != nil {
		p.t.Fatal(err)
	}
	rest, _ := p.readRest()
	select {
	case err := <-p.done:
		if err != nil {
			p.t.Fatalf("pid %d exited: %v (stderr %q)", p.Pid, err, p.stderr.String())
		}
	case <-time.After(time.Minute):
		p.t.Fatalf("pid %d did not exit within a minute of its stop file", p.Pid)
	}
	return rest, p.stderr.String()
}

// Wait waits for an exit the test caused some other way and returns its error.
func (p *Process) Wait() error { return <-p.done }

// Line returns the program's next line of output (without its newline),
// failing the test if the program ends first: the handshake of fixtures
// that report a step they made on their own (reload.c's `reloaded`).
func (p *Process) Line() string {
	p.t.Helper()
	line, err := p.stdout.ReadString('\n')
	if err != nil {
		p.t.Fatalf("pid %d: reading its output: %v (got %q, stderr %q)", p.Pid, err, line, p.stderr.String())
	}
	return strings.TrimSuffix(line, "\n")
}

func (p *Process) readRest() (string, error) {
	var b strings.Builder
	_, err := p.stdout.WriteTo(&b)
	return b.String(), err
}

// Symbol returns the run-time address of a symbol of the ELF object mapped
// from path (the executable or a shared library) in the process.
func (p *Process) Symbol(path, name string) uint64 {
	p.t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		p.t.Fatal(err)
	}
	defer f.Close()
	syms, _ := f.Symbols()
	var value uint64
	for _, s := range syms {
		if s.Name == name {
			value = s.Value
		}
	}
	if value == 0 {
		p.t.Fatalf("%s has no symbol %s", path, name)
	}
	if f.Type == elf.ET_EXEC {
		return value
	}
	return value + p.base(path)
}

// base returns the load address of the object mapped from path: the start
// of its mapping at file offset 0. Both fixtures and toolchain put the first
// PT_LOAD at virtual address 0 for ET_DYN objects, which makes that the bias.
func (p *Process) base(path string) uint64 {
	p.t.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", p.Pid))
	if err != nil {
		p.t.Fatal(err)
	}
	real, _ := filepath.EvalSymlinks(path)
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && (f[5] == path || f[5] == real) && f[2] == "00000000" {
			var start uint64
			fmt.Sscanf(f[0], "%x-", &start)
			return start
		}
	}
	p.t.Fatalf("%s is not mapped in pid %d", path, p.Pid)
	return 0
}

// Read64 reads a 64-bit little-endian value from the process's memory.
func (p *Process) Read64(addr uint64) uint64 {
	p.t.Helper()
	// Through a live thread: the main thread may have exited (procfs.Via).
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", procfs.Via(p.Pid)))
	if err != nil {
		p.t.Fatal(err)
	}
	defer f.Close()
	var b [8]byte
	if _, err := f.ReadAt(b[:], int64(addr)); err != nil {
		p.t.Fatalf("reading pid %d at %#x: %v", p.Pid, addr, err)
	}
	return binary.LittleEndian.Uint64(b[:])
}

// AwaitProgress polls a counter in the process until it has grown by at
// least n, failing after a minute. Polling a value the program itself
// advances is the synchronisation: no fixed sleep stands in for it.
func (p *Process) AwaitProgress(addr, n uint64) {
	p.t.Helper()
	start := p.Read64(addr)
	deadline := time.Now().Add(time.Minute)
	for p.Read64(addr)-start < n {
		if time.Now().After(deadline) {
			p.t.Fatalf("pid %d made less than %d progress in a minute", p.Pid, n)
		}
		runtime.Gosched()
	}
}
