package xmod_test

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/procmaps"
	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// soak returns how long each stress test toggles: 2s, or EDGEPROBE_SOAK
// (a Go duration) for long runs.
func soak(t testing.TB) time.Duration {
	if v := os.Getenv("EDGEPROBE_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("EDGEPROBE_SOAK=%q: %v", v, err)
		}
		return d
	}
	return 2 * time.Second
}

// stressTarget is a running stress fixture (testdata/fixtures/stress.c).
type stressTarget struct {
	fix     testutil.Fixture
	cmd     *exec.Cmd
	pid     int
	stdin   io.WriteCloser
	out     *bufio.Reader
	stderr  *testutil.SyncBuffer
	bias    uint64
	syms    map[string]uint64 // ELF virtual addresses
	nexec   int
	mem     *ptrace.Mem // for the test's own reads
	stopped bool
}

func buildStress(t testing.TB, pie bool) testutil.Fixture {
	testutil.RequirePtrace(t)
	return testutil.Build(t, testutil.Spec{Sources: []string{"stress.c"}, NoInstr: true, PIE: testutil.Bool(pie)})
}

// startStress runs the fixture with n executor threads (and a thread-churning
// thread when churn) and waits for its "ready" line.
func startStress(t testing.TB, fix testutil.Fixture, n int, churn bool) *stressTarget {
	t.Helper()
	mode := ""
	if churn {
		mode = "churn"
	}
	return startStressMode(t, fix, n, mode)
}

// startStressMode is startStress with the fixture's second argument: ""
// (executors only), "churn" (a thread-churning thread) or "fork" (a thread
// that forks and vforks children which run the sites).
func startStressMode(t testing.TB, fix testutil.Fixture, n int, mode string) *stressTarget {
	t.Helper()
	args := []string{strconv.Itoa(n)}
	if mode != "" {
		args = append(args, mode)
	}
	st := &stressTarget{fix: fix, cmd: exec.Command(fix.Path, args...), stderr: &testutil.SyncBuffer{}, nexec: n}
	st.cmd.Stderr = st.stderr
	var err error
	if st.stdin, err = st.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := st.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := testutil.StartBound(st.cmd); err != nil {
		t.Fatal(err)
	}
	st.pid = st.cmd.Process.Pid
	t.Cleanup(func() {
		if !st.stopped {
			st.cmd.Process.Kill()
			st.cmd.Wait()
		}
	})
	st.out = bufio.NewReader(stdout)
	line, err := st.out.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready ") {
		t.Fatalf("fixture %s: want a ready line, got %q, %v (stderr %s)", fix.Command, line, err, st.stderr)
	}
	ef, err := elf.Open(fix.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, err := ef.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	st.syms = map[string]uint64{}
	for _, s := range syms {
		if strings.HasPrefix(s.Name, "stress_") {
			st.syms[s.Name] = s.Value
		}
	}
	obj, err := procmaps.Main(st.pid)
	if err != nil {
		t.Fatal(err)
	}
	st.bias = obj.Bias
	if st.mem, err = ptrace.OpenMem(st.pid); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.mem.Close() })
	return st
}

func (st *stressTarget) addr(t testing.TB, sym string) uint64 {
	t.Helper()
	v, ok := st.syms[sym]
	if !ok {
		t.Fatalf("fixture has no symbol %s", sym)
	}
	return v + st.bias
}

var nop5 = []byte{0x0f, 0x1f, 0x44, 0x00, 0x00}

// sites returns the five call sites. With flip, the inert form is the
// one-byte flip (e8 -> 3d, cmp eax, imm32); otherwise a 5-byte NOP, which
// differs from the call in every byte.
func (st *stressTarget) sites(t testing.TB, flip bool) []xmod.Site {
	t.Helper()
	var out []xmod.Site
	for k := 0; k < 5; k++ {
		a := st.addr(t, fmt.Sprintf("stress_site%d", k))
		act := make([]byte, 5)
		if err := st.mem.ReadMem(a, act); err != nil {
			t.Fatal(err)
		}
		if act[0] != 0xe8 {
			t.Fatalf("stress_site%d at %#x holds % x, not a call", k, a, act)
		}
		in := append([]byte(nil), nop5...)
		if flip {
			in = append([]byte{0x3d}, act[1:]...)
		}
		out = append(out, xmod.Site{Addr: a, Active: act, Inert: in})
	}
	out[0].Name = "stress_site0(no straddle)"
	for k := 1; k < 5; k++ {
		out[k].Name = fmt.Sprintf("stress_site%d(split %d|%d)", k, k, 5-k)
	}
	return out
}

func (st *stressTarget) words(t testing.TB, sym string, n int) []uint64 {
	t.Helper()
	b := make([]byte, 8*n)
	if err := st.mem.ReadMem(st.addr(t, sym), b); err != nil {
		t.Fatal(err)
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return out
}

func (st *stressTarget) hits(t testing.TB) []uint64 { return st.words(t, "stress_hits", 5) }

// advance polls until every executor has run its loop at least n more
// times (bounded polling of a counter we read; there is no event for it).
func (st *stressTarget) advance(t testing.TB, n uint64) {
	t.Helper()
	base := st.words(t, "stress_progress", st.nexec)
	deadline := time.Now().Add(20 * time.Second)
	for {
		cur := st.words(t, "stress_progress", st.nexec)
		ok := true
		for i := range cur {
			if cur[i] < base[i]+n {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("executors did not advance by %d loops in 20s: %v -> %v (stderr %s)", n, base, cur, st.stderr)
		}
		time.Sleep(time.Millisecond) // polling interval, not synchronisation
	}
}

// finish asks the fixture to stop and returns its done line; it fails the
// test unless the fixture reports result=ok and exits 0. Call only after
// the tracer has detached (a wait by this process would take its events).
func (st *stressTarget) finish(t testing.TB) string {
	t.Helper()
	fmt.Fprintln(st.stdin, "stop")
	st.stdin.Close()
	line, _ := st.out.ReadString('\n')
	err := st.cmd.Wait()
	st.stopped = true
	if err != nil || !strings.Contains(line, "result=ok") {
		t.Fatalf("fixture failed: %v; output %q; stderr:\n%s", err, line, st.stderr)
	}
	return strings.TrimSpace(line)
}

func changes(sites []xmod.Site, on bool) []xmod.Change {
	cs := make([]xmod.Change, len(sites))
	for i, s := range sites {
		cs[i] = xmod.Change{Site: s, On: on}
	}
	return cs
}

// requireValid fails unless every site holds one of its forms.
func requireValid(t testing.TB, m xmod.Mem, sites []xmod.Site) []xmod.State {
	t.Helper()
	states, err := xmod.Classify(m, sites)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range states {
		if s == xmod.StateInvalid {
			b := make([]byte, sites[i].Len())
			m.ReadMem(sites[i].Addr, b)
			t.Errorf("%v holds % x: neither form", sites[i], b)
		}
	}
	return states
}
