package calibrate

import (
	"bufio"
	"context"
	"debug/elf"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/procmaps"
	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// TargetSource is the C source of the bundled target (also the tests'
// stress fixture: testdata/fixtures/stress.c links to it).
//
//go:embed target/stress.c
var TargetSource []byte

// ErrNoCompiler: no C compiler to build the target with.
var ErrNoCompiler = errors.New("no C compiler found")

// findCC returns the compiler to use: cc if given, else $CC, else the first
// of gcc, clang, cc on $PATH.
func findCC(cc string) (string, error) {
	if cc == "" {
		cc = os.Getenv("CC")
	}
	if cc != "" {
		p, err := exec.LookPath(cc)
		if err != nil {
			return "", fmt.Errorf("calibrate: C compiler %q: %w (%v)", cc, ErrNoCompiler, err)
		}
		return p, nil
	}
	for _, c := range []string{"gcc", "clang", "cc"} {
		if p, err := exec.LookPath(c); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("calibrate: %w (tried $CC, gcc, clang, cc): the calibration target is C compiled at run time; install gcc or clang, or set CC", ErrNoCompiler)
}

// program is the compiled target.
type program struct {
	path    string
	command string            // the build command, for messages
	syms    map[string]uint64 // stress_* ELF virtual addresses
}

// build compiles the target into dir.
func build(ctx context.Context, dir, cc string) (*program, error) {
	src := filepath.Join(dir, "stress.c")
	if err := os.WriteFile(src, TargetSource, 0o644); err != nil {
		return nil, err
	}
	out := filepath.Join(dir, "target")
	args := []string{"-O2", "-pthread", "stress.c", "-o", "target"}
	p := &program{path: out, command: filepath.Base(cc) + " " + strings.Join(args, " ")}
	if v, err := exec.CommandContext(ctx, cc, "--version").Output(); err == nil {
		first, _, _ := strings.Cut(string(v), "\n")
		p.command += " (" + strings.TrimSpace(first) + ")"
	}
	cmd := exec.CommandContext(ctx, cc, args...)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("calibrate: building the target (%s): %v\n%s", p.command, err, b)
	}
	ef, err := elf.Open(out)
	if err != nil {
		return nil, fmt.Errorf("calibrate: target: %w", err)
	}
	defer ef.Close()
	syms, err := ef.Symbols()
	if err != nil {
		return nil, fmt.Errorf("calibrate: target symbols: %w", err)
	}
	p.syms = map[string]uint64{}
	for _, s := range syms {
		if strings.HasPrefix(s.Name, "stress_") {
			p.syms[s.Name] = s.Value
		}
	}
	for _, name := range []string{"stress_torn", "stress_bad", "stress_progress", "stress_site0", "stress_site1", "stress_site2", "stress_site3", "stress_site4"} {
		if _, ok := p.syms[name]; !ok {
			return nil, fmt.Errorf("calibrate: target built by %s has no symbol %s", p.command, name)
		}
	}
	return p, nil
}

// reportLog collects the target's stderr: "torn ..." lines are reports,
// the rest is kept (last few) for messages.
type reportLog struct {
	mu     sync.Mutex
	ntorn  int      // torn lines so far
	from   int      // kept holds torn lines from index from on
	kept   []string // at most maxReports of them
	other  []string // last non-torn lines
	notify chan struct{}
	eof    chan struct{}
}

func newReportLog() *reportLog {
	return &reportLog{notify: make(chan struct{}, 1), eof: make(chan struct{})}
}

func (l *reportLog) read(r io.Reader) {
	defer close(l.eof)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		l.mu.Lock()
		if strings.HasPrefix(line, "torn ") {
			if l.ntorn >= l.from && len(l.kept) < maxReports {
				l.kept = append(l.kept, line)
			}
			l.ntorn++
		} else {
			l.other = append(l.other, line)
			if len(l.other) > 20 {
				l.other = l.other[1:]
			}
		}
		l.mu.Unlock()
		select {
		case l.notify <- struct{}{}:
		default:
		}
	}
	io.Copy(io.Discard, r)
}

func (l *reportLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ntorn
}

// mark starts keeping torn lines afresh and returns the count so far.
func (l *reportLog) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.from, l.kept = l.ntorn, nil
	return l.ntorn
}

// since returns the torn lines kept since the last mark.
func (l *reportLog) since() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.kept...)
}

func (l *reportLog) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.other, "\n")
}

// waitCount waits until at least n torn lines have arrived, stderr is
// closed, or the timeout passes (the target wrote each line before its
// counter could be seen to move, so they are in the pipe already).
func (l *reportLog) waitCount(n int, timeout time.Duration) {
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	for l.count() < n {
		select {
		case <-l.notify:
		case <-l.eof:
			return
		case <-tm.C:
			return
		}
	}
}

// target is one running instance of the program.
type target struct {
	prog    *program
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	stdout  *bufio.Reader
	pid     int
	bias    uint64
	threads int
	mem     *ptrace.Mem
	tr      *ptrace.Tracer
	log     *reportLog
	ended   bool
}

// start runs the program with n executor threads and waits for its ready
// line (the executors all run by then).
func (p *program) start(n int) (*target, error) {
	t := &target{prog: p, threads: n, log: newReportLog()}
	t.cmd = exec.Command(p.path, strconv.Itoa(n))
	var err error
	if t.stdin, err = t.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := t.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := t.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := t.cmd.Start(); err != nil {
		return nil, fmt.Errorf("calibrate: starting the target: %w", err)
	}
	t.pid = t.cmd.Process.Pid
	go t.log.read(stderr)
	t.stdout = bufio.NewReader(stdout)
	line, err := t.stdout.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready ") {
		t.kill()
		return nil, fmt.Errorf("calibrate: target %s: want a ready line, got %q (%v); stderr: %s", p.path, line, err, t.log.tail())
	}
	obj, err := procmaps.Main(t.pid)
	if err != nil {
		t.kill()
		return nil, fmt.Errorf("calibrate: target: %w", err)
	}
	t.bias = obj.Bias
	if t.mem, err = ptrace.OpenMem(t.pid); err != nil {
		t.kill()
		return nil, fmt.Errorf("calibrate: target: %w", err)
	}
	return t, nil
}

// attach makes the target traced (the int3 variants need every thread).
func (t *target) attach() error {
	if t.tr != nil {
		return nil
	}
	tr, err := ptrace.Attach(t.pid, ptrace.Options{})
	if err != nil {
		return fmt.Errorf("calibrate: attach to the target: %w", err)
	}
	t.tr = tr
	return nil
}

func (t *target) addr(sym string) uint64 { return t.prog.syms[sym] + t.bias }

func (t *target) words(sym string, n int) ([]uint64, error) {
	b := make([]byte, 8*n)
	if err := t.mem.ReadMem(t.addr(sym), b); err != nil {
		return nil, err
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return out, nil
}

// counters reads the target's torn and bad counters.
func (t *target) counters() (torn, bad uint64, err error) {
	w, err := t.words("stress_torn", 1)
	if err != nil {
		return 0, 0, err
	}
	b, err := t.words("stress_bad", 1)
	if err != nil {
		return 0, 0, err
	}
	return w[0], b[0], nil
}

var nop5 = []byte{0x0f, 0x1f, 0x44, 0x00, 0x00}

// site returns stress_siteK as an xmod site: the call and, as the inert
// form, a 5-byte NOP (every byte differs) or, for flip, cmp eax,imm32 (3d:
// only byte 0 differs).
func (t *target) site(k int, flip bool) (xmod.Site, error) {
	a := t.addr(fmt.Sprintf("stress_site%d", k))
	act := make([]byte, 5)
	if err := t.mem.ReadMem(a, act); err != nil {
		return xmod.Site{}, err
	}
	if act[0] != 0xe8 {
		return xmod.Site{}, fmt.Errorf("calibrate: target's stress_site%d at %#x holds % x, not a call", k, a, act)
	}
	in := append([]byte(nil), nop5...)
	if flip {
		in = append([]byte{0x3d}, act[1:]...)
	}
	return xmod.Site{Addr: a, Active: act, Inert: in, Name: fmt.Sprintf("stress_site%d(split %s)", k, splitName(k))}, nil
}

// settle waits until every executor has completed at least two more loops:
// a thread that faulted before this call has counted it by then (the
// handler counts first, and the loop runs again only after the handler).
// This polls a counter in the target's memory; there is no event for it.
func (t *target) settle(ctx context.Context, timeout time.Duration) error {
	base, err := t.words("stress_progress", t.threads)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		cur, err := t.words("stress_progress", t.threads)
		if err != nil {
			return err
		}
		ok := true
		for i := range cur {
			if cur[i] < base[i]+2 {
				ok = false
			}
		}
		if ok {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("calibrate: target executors did not advance in %v: %v -> %v", timeout, base, cur)
		}
		time.Sleep(200 * time.Microsecond) // polling interval
	}
}

// stop ends a live target: detach, ask it to stop, collect its done line.
func (t *target) stop() (string, error) {
	if t.ended {
		return "", nil
	}
	var derr error
	if t.tr != nil {
		derr = t.tr.Detach()
		t.tr = nil
	}
	fmt.Fprintln(t.stdin, "stop")
	t.stdin.Close()
	line, _ := t.stdout.ReadString('\n')
	werr := t.cmd.Wait()
	t.ended = true
	t.mem.Close()
	if derr != nil {
		return strings.TrimSpace(line), derr
	}
	if werr != nil && !strings.Contains(line, "result=BAD") {
		return strings.TrimSpace(line), fmt.Errorf("calibrate: target: %v (stderr: %s)", werr, t.log.tail())
	}
	return strings.TrimSpace(line), nil
}

// kill ends a target that died or must go now, and says how it ended.
func (t *target) kill() string {
	if t.ended {
		return ""
	}
	if t.tr != nil {
		_ = t.tr.Detach() // on a dead process: just cleans up
		t.tr = nil
	}
	_ = t.cmd.Process.Kill()
	if t.stdin != nil {
		t.stdin.Close()
	}
	err := t.cmd.Wait()
	t.ended = true
	if t.mem != nil {
		t.mem.Close()
	}
	select {
	case <-t.log.eof:
	case <-time.After(2 * time.Second):
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "exited with status 0"
	case errors.As(err, &ee):
		return ee.Error() // "signal: killed", "exit status 4", ...
	case errors.Is(err, syscall.ECHILD):
		// The tracer thread, in our thread group, reaped the exit: the
		// kernel releases a traced child fully when its tracer shares the
		// real parent's thread group. The status is gone with it.
		return "exit status reaped by the tracer"
	}
	return err.Error()
}

// dead reports whether err means the target is gone.
func dead(err error) bool {
	return errors.Is(err, ptrace.ErrExited) || errors.Is(err, ptrace.ErrNoProcess) || errors.Is(err, ptrace.ErrDetached)
}

// alive reports whether the target process still runs (not a zombie).
func (t *target) alive() bool {
	return !procfs.Gone(t.pid, 0)
}
