package shm

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// buildRuntime returns the runtime library built with cc.
func buildRuntime(t testing.TB, cc string) string { return testutil.Runtime(t, cc) }

// buildCounts builds libfix.so and counts.c linked against it.
func buildCounts(t testing.TB, cc, opt string, extra ...string) (bin, libdir string) {
	t.Helper()
	lib := testutil.Build(t, testutil.Spec{Compiler: cc, Opt: opt, Sources: []string{"lib.c"}, Shared: true,
		Flags: append([]string{"-Wl,-soname,libfix.so"}, extra...), Name: "libfix.so"})
	libdir = filepath.Dir(lib.Path)
	exe := testutil.Build(t, testutil.Spec{Compiler: cc, Opt: opt, Sources: []string{"counts.c"}, Flags: extra,
		LDFlags: []string{"-L" + libdir, "-lfix"}, Name: "counts-" + cc + opt + strings.Join(extra, "")})
	return exe.Path, libdir
}

type runResult struct {
	stdout, stderr string
	err            error
}

// runWith runs bin with env added to the environment; lib (if non-empty) is
// preloaded.
func runWith(t testing.TB, lib, bin string, env []string, args ...string) runResult {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	if lib != "" {
		cmd.Env = append(cmd.Env, "LD_PRELOAD="+lib)
	}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := testutil.RunBound(cmd)
	return runResult{o.String(), e.String(), err}
}

func mustRun(t testing.TB, lib, bin string, env []string, args ...string) string {
	t.Helper()
	r := runWith(t, lib, bin, env, args...)
	if r.err != nil {
		t.Fatalf("%s %v (env %v, preload %q): %v\nstdout:\n%s\nstderr:\n%s", bin, args, env, lib, r.err, r.stdout, r.stderr)
	}
	if r.stderr != "" {
		t.Fatalf("%s wrote to stderr:\n%s", bin, r.stderr)
	}
	return r.stdout
}

// openOutput opens an EDGEPROBE_OUTPUT file and registers its Close.
func openOutput(t testing.TB, path string) *Region {
	t.Helper()
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

type mapping struct {
	start, end, off uint64
	path            string
}

func parseMaps(b []byte) []mapping {
	var ms []mapping
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || !strings.HasPrefix(f[5], "/") {
			continue
		}
		se := strings.SplitN(f[0], "-", 2)
		s, _ := strconv.ParseUint(se[0], 16, 64)
		e, _ := strconv.ParseUint(se[1], 16, 64)
		o, _ := strconv.ParseUint(f[2], 16, 64)
		ms = append(ms, mapping{s, e, o, strings.Join(f[5:], " ")})
	}
	return ms
}

type symbol struct {
	addr, size uint64
	name       string
}

// symbolizer maps runtime addresses to function names using a process's
// memory map and the ELF symbol tables of the files it names.
type symbolizer struct{ syms []symbol }

func newSymbolizer(t testing.TB, maps []byte) *symbolizer {
	t.Helper()
	ms := parseMaps(maps)
	files := map[string]bool{}
	for _, m := range ms {
		files[m.path] = true
	}
	s := &symbolizer{}
	for path := range files {
		f, err := elf.Open(path)
		if err != nil {
			continue
		}
		syms, _ := f.Symbols()
		dyn, _ := f.DynamicSymbols()
		syms = append(syms, dyn...)
		for _, sym := range syms {
			if elf.ST_TYPE(sym.Info) != elf.STT_FUNC || sym.Value == 0 {
				continue
			}
			for _, p := range f.Progs {
				if p.Type != elf.PT_LOAD || sym.Value < p.Vaddr || sym.Value >= p.Vaddr+p.Memsz {
					continue
				}
				foff := sym.Value - p.Vaddr + p.Off
				for _, m := range ms {
					if m.path == path && foff >= m.off && foff < m.off+(m.end-m.start) {
						name := sym.Name
						if i := strings.IndexByte(name, '.'); i > 0 {
							name = name[:i] // f.constprop.0, g.isra.0 ...
						}
						s.syms = append(s.syms, symbol{m.start + foff - m.off, sym.Size, name})
						break
					}
				}
			}
		}
		f.Close()
	}
	sort.Slice(s.syms, func(i, j int) bool { return s.syms[i].addr < s.syms[j].addr })
	return s
}

// name resolves an exact entry address, or with contain a containing function.
func (s *symbolizer) name(addr uint64, contain bool) (string, bool) {
	i := sort.Search(len(s.syms), func(i int) bool { return s.syms[i].addr > addr }) - 1
	if i < 0 {
		return "", false
	}
	sy := s.syms[i]
	if sy.addr == addr || (contain && addr < sy.addr+sy.size) {
		return sy.name, true
	}
	return "", false
}

// byName sums the region's functions per resolved name; it fails the test
// on an address no symbol explains.
func byName(t testing.TB, r *Region, maps []byte) map[string]Func {
	t.Helper()
	sym := newSymbolizer(t, maps)
	out := map[string]Func{}
	for _, f := range r.Functions() {
		name, ok := sym.name(f.Addr, f.Bare)
		if !ok {
			t.Errorf("function address %#x (bare %v, %d/%d) resolves to no symbol; maps:\n%s", f.Addr, f.Bare, f.Entries, f.Exits, maps)
			continue
		}
		g := out[name]
		g.Addr = f.Addr
		g.Bare = f.Bare
		g.Entries += f.Entries
		g.Exits += f.Exits
		g.Orphans += f.Orphans
		g.Unmatched += f.Unmatched
		g.DeepEntries += f.DeepEntries
		g.DeepExits += f.DeepExits
		g.Open += f.Open
		g.Samples += f.Samples
		g.SumNs += f.SumNs
		for b := range g.Hist {
			g.Hist[b] += f.Hist[b]
		}
		if f.MaxNs > g.MaxNs {
			g.MaxNs = f.MaxNs
		}
		if g.MinNs == 0 || (f.MinNs != 0 && f.MinNs < g.MinNs) {
			g.MinNs = f.MinNs
		}
		out[name] = g
	}
	return out
}

type ee struct{ entries, exits uint64 }

// checkCounts compares entries/exits per name with want, and that no other
// function was recorded.
func checkCounts(t testing.TB, got map[string]Func, want map[string]ee) {
	t.Helper()
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("%s: not recorded (want %d/%d)", name, w.entries, w.exits)
			continue
		}
		if g.Entries != w.entries || g.Exits != w.exits {
			t.Errorf("%s: entries/exits = %d/%d, want %d/%d", name, g.Entries, g.Exits, w.entries, w.exits)
		}
	}
	for name, g := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("unexpected function %s recorded (%d/%d)", name, g.Entries, g.Exits)
		}
	}
}

func countsWant(k uint64) map[string]ee {
	const T, depth = 4, 12
	return map[string]ee{
		"main": {1, 1}, "worker": {T, T}, "f": {T * k, T * k}, "g": {T * k, T * k},
		"add": {T * k / 2, T * k / 2}, "mul": {T * k / 2, T * k / 2}, "rec": {T * (depth + 1), T * (depth + 1)},
		"lib_entry": {10, 10}, "lib_hidden": {10, 10}, "lib_static": {10, 10},
	}
}

// noShm fails the test if /dev/shm holds a file naming pid the way older
// runtimes named their regions (the region is a memfd now: nothing there).
func noShm(t testing.TB, pid int) {
	t.Helper()
	for _, name := range []string{"edgeprobe." + strconv.Itoa(pid), ".edgeprobe.init." + strconv.Itoa(pid)} {
		if _, err := os.Lstat(filepath.Join("/dev/shm", name)); err == nil {
			t.Errorf("/dev/shm/%s exists", name)
		}
	}
}

// runForked runs a fixture that forks (printing "child PID status N") with
// EDGEPROBE_OUTPUT set, and returns the parent's and the child's output
// regions, after checking there is exactly one per process and that the
// child's names its parent.
func runForked(t testing.TB, lib, bin, mode string, env ...string) (parent, child *Region) {
	t.Helper()
	dir := t.TempDir()
	got := mustRun(t, lib, bin, append([]string{"EDGEPROBE_OUTPUT=" + filepath.Join(dir, "out.%p")}, env...), mode)
	var pid, status int
	if _, err := fmt.Sscanf(got, "child %d status %d", &pid, &status); err != nil || status != 0 {
		t.Fatalf("fixture output %q", got)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Fatalf("output files %v, want one per process", ents)
	}
	childOut := "out." + strconv.Itoa(pid)
	for _, e := range ents {
		if e.Name() != childOut {
			parent = openOutput(t, filepath.Join(dir, e.Name()))
		}
	}
	child = openOutput(t, filepath.Join(dir, childOut))
	if int(child.Header().Pid) != pid || child.Header().Ppid != parent.Header().Pid {
		t.Errorf("child region pid %d ppid %d, want %d, %d", child.Header().Pid, child.Header().Ppid, pid, parent.Header().Pid)
	}
	return parent, child
}
