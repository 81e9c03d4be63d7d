package shm

import (
	"bufio"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// The fentry provider: fixtures built with -pg -mfentry (compile only, no
// -pg at link: testutil.ProfileFentry), run under the runtime, where every probed function's first
// instruction calls the runtime's __fentry__. Expected counts are in the
// fixtures' headers (testdata/fixtures/fentry.c, fentry_exc.cc).

// avx2Libc makes glibc pick its AVX2 string functions, which end in
// vzeroupper (the AVX-512 ones it prefers here do not touch ymm0-15): the
// runtime's slow paths (slot claim: getenv, ...) then clobber the upper
// halves of ymm0-7 unless the assembly saves them with xsave, which the
// __m256d checks of fentry.c catch.
const avx2Libc = "GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD"

func requireAVX(t testing.TB) {
	t.Helper()
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil || !strings.Contains(string(b), " avx ") {
		testutil.Unavailable(t, "the fentry fixture is built with -mavx and this CPU has no AVX")
	}
}

type fentryBuild struct {
	cc    string
	pie   bool
	extra []string // more compiler flags, e.g. -fcf-protection
}

func (b fentryBuild) String() string {
	s := b.cc
	if b.pie {
		s += "-pie"
	} else {
		s += "-nopie"
	}
	for _, e := range b.extra {
		s += strings.TrimPrefix(e, "-")
	}
	return s
}

// build returns fentry.c linked against libfentrylib.so (both -pg -mfentry)
// and the directory holding the library (the binary has it as its rpath).
func (b fentryBuild) build(t testing.TB) (bin string) {
	t.Helper()
	requireAVX(t)
	lib := testutil.Build(t, testutil.Spec{Compiler: b.cc, Sources: []string{"fentrylib.c"}, Shared: true, NoInstr: true,
		Profile: testutil.ProfileFentry, Flags: append([]string{"-Wl,-soname,libfentrylib.so"}, b.extra...), Name: "libfentrylib.so"})
	dir := filepath.Dir(lib.Path)
	return testutil.Build(t, testutil.Spec{Compiler: b.cc, Sources: []string{"fentry.c"}, PIE: testutil.Bool(b.pie), NoInstr: true,
		Profile: testutil.ProfileFentry, Flags: append([]string{"-mavx"}, b.extra...),
		LDFlags: []string{"-L" + dir, "-lfentrylib", "-Wl,-rpath," + dir}, Name: "fentry-" + b.String()}).Path
}

// runFentry runs a mode of bin under lib (and without it, to compare the
// output) and returns the output file's region.
func runFentry(t testing.TB, lib, bin string, env []string, args ...string) *Region {
	t.Helper()
	plain := mustRun(t, "", bin, nil, args...)
	out := filepath.Join(t.TempDir(), "out")
	got := mustRun(t, lib, bin, append([]string{"EDGEPROBE_OUTPUT=" + out}, env...), args...)
	if got != plain && args[0] != "fork" {
		t.Errorf("output under the runtime %q, without %q", got, plain)
	}
	return openOutput(t, out)
}

func fentryCountsWant(cc string, k uint64) map[string]ee {
	const T = 4
	w := map[string]ee{
		"main": {1, 1}, "mode_counts": {1, 1}, "worker": {T, T}, "f": {T * k, T * k}, "g": {T * k, T * k},
		"add": {T * k / 2, T * k / 2}, "mul": {T * k / 2, T * k / 2}, "tc": {T * k, T * k}, "leaf2": {T * k, T * k},
		"rec": {T * 13, T * 13}, "v256": {1, 1}, "fl_entry": {10, 10}, "fl_hidden": {10, 10}, "fl_static": {10, 10},
	}
	for _, f := range []string{"args_check", "many", "vsum", "ldret", "cld", "sret", "dret", "bret"} {
		w[f] = ee{T * k, T * k}
	}
	if cc == "gcc" {
		w["nested"] = ee{T * k, T * k}
		w["inner"] = ee{2 * T * k, 2 * T * k} // called with its static chain in r10
	}
	return w
}

func noMismatch(t testing.TB, c Counters) {
	t.Helper()
	if c.Orphans+c.Unmatched+c.FuncDropEnters+c.FuncDropExits+c.ThreadDropHits+c.PreinitDrops+c.LateDrops+c.StackOverflows+c.ReentrantDrops+c.FentryBadSites != 0 {
		t.Errorf("unexpected drops or mismatches: %+v", c)
	}
}

// TestFentryExactCounts: multi-threaded exact entry and exit counts with
// gcc and clang, PIE and not (gcc's PIE sites are "call *__fentry__@GOTPCREL",
// ff 15; the others e8), endbr64 before the call (-fcf-protection), a shared
// library, tail calls, recursion, a nested function's static chain, every
// kind of argument and return value, and a thread whose first probed
// function takes AVX arguments.
func TestFentryExactCounts(t *testing.T) {
	const k = 500
	builds := []fentryBuild{
		{cc: "gcc", pie: true}, {cc: "gcc", pie: false}, {cc: "clang", pie: true}, {cc: "clang", pie: false},
		{cc: "gcc", pie: true, extra: []string{"-fcf-protection=full"}}, {cc: "clang", pie: false, extra: []string{"-fcf-protection=full"}},
	}
	for _, b := range builds {
		t.Run(b.String(), func(t *testing.T) {
			lib := buildRuntime(t, b.cc)
			bin := b.build(t)
			for _, mode := range []struct {
				name string
				env  []string
			}{
				{"default", nil},
				{"count-only", []string{"EDGEPROBE_TIMING=0"}},
				{"shared-counters", []string{"EDGEPROBE_LOCAL_FUNCS=0"}},
				{"entries-only", []string{"EDGEPROBE_FENTRY_EXITS=0"}},
				{"avx2-libc", []string{avx2Libc}},
			} {
				t.Run(mode.name, func(t *testing.T) {
					r := runFentry(t, lib, bin, mode.env, "counts", strconv.Itoa(k))
					funcs := byName(t, r, r.Maps())
					want := fentryCountsWant(b.cc, k)
					h := r.Header()
					if mode.name == "entries-only" {
						for n, w := range want {
							want[n] = ee{w.entries, 0}
						}
						if h.FentryMode != FentryUsed|FentryExitsOff {
							t.Errorf("fentry mode %#x, want used|exits-off", h.FentryMode)
						}
					} else if h.FentryMode != FentryUsed|FentryExits {
						t.Errorf("fentry mode %#x, want used|exits", h.FentryMode)
					}
					checkCounts(t, funcs, want)
					c := r.Counters()
					noMismatch(t, c)
					if c.FentrySites == 0 || c.ThreadsClaimed != 6 {
						t.Errorf("fentry sites %d, threads claimed %d (want 6: main, 4 workers, the AVX thread)", c.FentrySites, c.ThreadsClaimed)
					}
					if mode.name == "default" {
						f, rec := funcs["f"], funcs["rec"]
						if f.Samples != f.Exits || f.MaxNs == 0 || f.MinNs > f.MaxNs {
							t.Errorf("f latency: samples %d (exits %d) min %d max %d", f.Samples, f.Exits, f.MinNs, f.MaxNs)
						}
						if rec.MaxNs < funcs["g"].MinNs {
							t.Errorf("rec max %d < g min %d", rec.MaxNs, funcs["g"].MinNs)
						}
					}
				})
			}
		})
	}
}

// TestFentryLongjmp: frames left by longjmp are dropped and counted
// unmatched; more rounds than the return-address stack holds.
func TestFentryLongjmp(t *testing.T) {
	const n = 1000 // 4000 dead frames, stack depth 256
	for _, b := range []fentryBuild{{cc: "gcc", pie: true}, {cc: "clang", pie: false}} {
		t.Run(b.String(), func(t *testing.T) {
			r := runFentry(t, buildRuntime(t, b.cc), b.build(t), nil, "longjmp", strconv.Itoa(n))
			funcs := byName(t, r, r.Maps())
			checkCounts(t, funcs, map[string]ee{"main": {1, 1}, "mode_longjmp": {1, 1}, "catcher": {n, n}, "deep": {4 * n, 0}})
			if d := funcs["deep"]; d.Unmatched != 4*n {
				t.Errorf("deep unmatched %d, want %d", d.Unmatched, 4*n)
			}
			if c := r.Counters(); c.Unmatched != 4*n || c.Orphans != 0 || c.StackOverflows != 0 {
				t.Errorf("counters %+v: want %d unmatched, no orphans or overflows", c, 4*n)
			}
			if c := funcs["catcher"]; c.Samples != n {
				t.Errorf("catcher timed exits %d, want %d", c.Samples, n)
			}
		})
	}
}

// TestFentrySignals: a handler on the same stack calls probed functions
// while the interrupted code has hijacked frames; a handler that lands in a
// hook is dropped as a whole.
func TestFentrySignals(t *testing.T) {
	const n = 3000
	b := fentryBuild{cc: "gcc", pie: true}
	r := runFentry(t, buildRuntime(t, "gcc"), b.build(t), nil, "sig", strconv.Itoa(n))
	funcs := byName(t, r, r.Maps())
	c := r.Counters()
	onSig, leaf := funcs["on_sig"], funcs["sig_leaf"]
	if onSig.Entries != onSig.Exits || leaf.Entries != onSig.Entries || leaf.Exits != leaf.Entries {
		t.Errorf("handler calls not paired: on_sig %d/%d sig_leaf %d/%d", onSig.Entries, onSig.Exits, leaf.Entries, leaf.Exits)
	}
	if c.ReentrantDrops%2 != 0 || onSig.Entries+c.ReentrantDrops/2 != n {
		t.Errorf("on_sig entries %d + reentrant drops %d/2 != %d signals", onSig.Entries, c.ReentrantDrops, n)
	}
	if s := funcs["spin"]; s.Entries != s.Exits || s.Entries == 0 {
		t.Errorf("spin %d/%d", s.Entries, s.Exits)
	}
	for _, name := range []string{"main", "mode_sig", "sender"} {
		if f := funcs[name]; f.Entries != 1 || f.Exits != 1 {
			t.Errorf("%s %d/%d, want 1/1", name, f.Entries, f.Exits)
		}
	}
	if c.Orphans+c.Unmatched != 0 {
		t.Errorf("mismatches: %+v", c)
	}
	t.Logf("%d of %d handler runs dropped as reentrant", c.ReentrantDrops/2, n)
}

// TestFentrySigLongjmp: a handler that siglongjmps out of probed frames
// (its own and the interrupted ones).
func TestFentrySigLongjmp(t *testing.T) {
	const n = 300
	for _, b := range []fentryBuild{{cc: "gcc", pie: false}, {cc: "clang", pie: true}} {
		t.Run(b.String(), func(t *testing.T) {
			r := runFentry(t, buildRuntime(t, b.cc), b.build(t), nil, "sigjmp", strconv.Itoa(n))
			funcs := byName(t, r, r.Maps())
			checkCounts(t, funcs, map[string]ee{"main": {1, 1}, "mode_sigjmp": {1, 1}, "jsender": {1, 1},
				"victim": {n, 0}, "inner": {n, 0}, "jumper": {n, 0}, "hleaf": {n, n}})
			if c := r.Counters(); c.Unmatched != 3*n || c.Orphans != 0 || c.ReentrantDrops != 0 {
				t.Errorf("counters %+v: want %d unmatched", c, 3*n)
			}
		})
	}
}

// TestFentryFork: fork while frames are hijacked. The child inherits the
// return-address stack (a private mapping, TLS pointer) and returns through
// the inherited frames (forker returns a __m256d through the trampoline's
// slow path, which claims the child's slot); their exits are orphans in the
// child's region, as with cyg probes.
func TestFentryFork(t *testing.T) {
	for _, b := range []fentryBuild{{cc: "gcc", pie: true}, {cc: "clang", pie: false}} {
		t.Run(b.String(), func(t *testing.T) {
			lib := buildRuntime(t, b.cc)
			bin := b.build(t)
			p, c := runForked(t, lib, bin, "fork", avx2Libc)
			checkCounts(t, byName(t, p, p.Maps()), map[string]ee{"main": {1, 1}, "mode_fork": {1, 1}, "outer": {1, 1},
				"forker": {1, 1}, "parent_work": {3, 3}, "parent_after": {2, 2}})
			noMismatch(t, p.Counters())
			cf := byName(t, c, c.Maps())
			checkCounts(t, cf, map[string]ee{"main": {0, 1}, "mode_fork": {0, 1}, "outer": {0, 1}, "forker": {0, 1}, "child_work": {5, 5}})
			if m := c.Header().FentryMode; m != FentryUsed|FentryExits {
				t.Errorf("child fentry mode %#x, want used|exits", m)
			}
			if cc := c.Counters(); cc.Orphans != 4 || cc.Unmatched != 0 {
				t.Errorf("child counters %+v: want 4 orphans (the frames entered before fork)", cc)
			}
		})
	}
}

// TestFentryPthreadExit: threads exit with pthread_exit from nested probed
// calls. glibc's forced unwind walks through the hijacked frames (the
// trampoline's FDE and personality give it the real return addresses), the
// frames count unmatched, the thread's state is freed, and later threads
// reuse the slots and stacks normally.
func TestFentryPthreadExit(t *testing.T) {
	const n, T = 200, 4
	for _, b := range []fentryBuild{{cc: "gcc", pie: true}, {cc: "clang", pie: true}} {
		t.Run(b.String(), func(t *testing.T) {
			r := runFentry(t, buildRuntime(t, b.cc), b.build(t), nil, "pthread_exit", strconv.Itoa(n))
			funcs := byName(t, r, r.Maps())
			checkCounts(t, funcs, map[string]ee{"main": {1, 1}, "mode_pthread_exit": {1, 1},
				"pworker": {T, 0}, "nest1": {T, 0}, "nest2": {T, 0}, "nest3": {T, 0}, "worker2": {T, T}, "work2": {T * n, T * n}})
			c := r.Counters()
			// glibc's unwinder stop function longjmps to start_thread as soon as
			// it reaches pworker's caller, before the trampoline frame of
			// pworker's own slot: 3 restored slots per thread, 4 dead frames.
			if c.Unmatched != 4*T || c.Orphans != 0 || c.FentryUnwound != 3*T {
				t.Errorf("counters %+v: want %d unmatched, %d unwound", c, 4*T, 3*T)
			}
			if c.ThreadsClaimed != 1+2*T || c.ThreadsActive != 1 {
				t.Errorf("threads claimed/active %d/%d, want %d/1", c.ThreadsClaimed, c.ThreadsActive, 1+2*T)
			}
		})
	}
}

// TestFentryCxxExceptions: C++ exceptions thrown through three probed
// frames (a destructor running during the unwinding, a rethrow), g++ and
// clang++, PIE and not. The unwinder finds the trampoline's FDE and its
// personality restores each hijacked return address before the unwinder
// reads it. Counting rule: a frame an exception unwinds never returns; its
// entry is counted, its exit is not, and it is counted unmatched.
func TestFentryCxxExceptions(t *testing.T) {
	const n = 300
	for _, cc := range []string{"g++", "clang++"} {
		for _, pie := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s-pie%v", cc, pie), func(t *testing.T) {
				lib := buildRuntime(t, "gcc")
				bin := testutil.Build(t, testutil.Spec{Compiler: cc, Sources: []string{"fentry_exc.cc"}, PIE: testutil.Bool(pie),
					NoInstr: true, Profile: testutil.ProfileFentry, Name: fmt.Sprintf("fentry_exc-%s-%v", cc, pie)}).Path
				r := runFentry(t, lib, bin, nil, strconv.Itoa(n))
				funcs := map[string]Func{}
				for name, f := range byName(t, r, r.Maps()) {
					if d, ok := cxxNames[name]; ok {
						name = d
					}
					funcs[name] = f
				}
				checkCounts(t, funcs, map[string]ee{"main": {1, 1}, "catcher": {n, n}, "catcher2": {n, n}, "ok": {n, n},
					"~Guard": {2 * n, 2 * n}, "l1": {2 * n, 0}, "l2": {2 * n, 0}, "l3": {2 * n, 0}, "rethrower": {n, 0}})
				for _, f := range []string{"l1", "l2", "l3"} {
					if u := funcs[f].Unmatched; u != 2*n {
						t.Errorf("%s unmatched %d, want %d", f, u, 2*n)
					}
				}
				c := r.Counters()
				if c.Unmatched != 7*n || c.Orphans != 0 || c.FentryUnwound != 7*n {
					t.Errorf("counters %+v: want %d unmatched and unwound", c, 7*n)
				}
			})
		}
	}
}

// cxxNames demangles the symbols of fentry_exc.cc (the destructor's D1 and D2
// are aliases: either may name it).
var cxxNames = map[string]string{"_Z2l1i": "l1", "_Z2l2i": "l2", "_Z2l3i": "l3", "_Z7catcheri": "catcher",
	"_Z8catcher2i": "catcher2", "_Z9rethroweri": "rethrower", "_Z2okl": "ok", "_ZN5GuardD1Ev": "~Guard", "_ZN5GuardD2Ev": "~Guard"}

// TestFentryShstkRefused: under a CET user shadow stack the runtime refuses
// exit probes (a swapped return address would fault) with one line on stderr
// and a header flag, and counts entries only. This CPU may have no shadow
// stack: EDGEPROBE_FENTRY_ASSUME_SHSTK=1 makes the detection report one.
func TestFentryShstkRefused(t *testing.T) {
	b := fentryBuild{cc: "gcc", pie: true}
	lib := buildRuntime(t, "gcc")
	bin := b.build(t)
	out := filepath.Join(t.TempDir(), "out")
	res := runWith(t, lib, bin, []string{"EDGEPROBE_OUTPUT=" + out, "EDGEPROBE_FENTRY_ASSUME_SHSTK=1"}, "counts", "50")
	if res.err != nil {
		t.Fatalf("%v\n%s", res.err, res.stderr)
	}
	if strings.Count(res.stderr, "\n") != 1 || !strings.Contains(res.stderr, "shadow stack") || !strings.Contains(res.stderr, "refused") {
		t.Errorf("stderr %q, want one line saying exit probes are refused", res.stderr)
	}
	r := openOutput(t, out)
	if m := r.Header().FentryMode; m != FentryUsed|FentrySHSTK {
		t.Errorf("fentry mode %#x, want used|shstk", m)
	}
	want := fentryCountsWant("gcc", 50)
	for n, w := range want {
		want[n] = ee{w.entries, 0}
	}
	checkCounts(t, byName(t, r, r.Maps()), want)
	// And the real detection on this machine: nothing refused unless the
	// kernel reports a shadow stack for the process.
	r2 := runFentry(t, lib, bin, nil, "counts", "10")
	t.Logf("fentry mode without the override: %#x", r2.Header().FentryMode)
}

// TestFentryFlipWhileHijacked: while outer_flip and held have hijacked
// frames in flight, the test switches both probes off (the call to
// __fentry__, e8, becomes the inert 3d at the function's first instruction,
// written through /proc/PID/mem); both frames still return through the
// trampoline to the right place, and their later calls are not probed.
func TestFentryFlipWhileHijacked(t *testing.T) {
	testutil.RequirePtrace(t)
	const k = 100
	for _, b := range []fentryBuild{{cc: "gcc", pie: false}, {cc: "clang", pie: true}, {cc: "gcc", pie: false, extra: []string{"-fcf-protection=full"}}} {
		t.Run(b.String(), func(t *testing.T) {
			lib := buildRuntime(t, b.cc)
			bin := b.build(t)
			plain := mustRunInput(t, "", bin, nil, "go\n", "flip", strconv.Itoa(k))
			out := filepath.Join(t.TempDir(), "out")
			cmd := exec.Command(bin, "flip", strconv.Itoa(k))
			cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib, "EDGEPROBE_OUTPUT="+out)
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := testutil.StartBound(cmd); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			rd := bufio.NewReader(stdout)
			if line, err := rd.ReadString('\n'); err != nil || line != "inside\n" {
				t.Fatalf("want inside, got %q %v (stderr %q)", line, err, stderr.String())
			}
			for _, fn := range []string{"outer_flip", "held"} {
				flipSite(t, cmd.Process.Pid, bin, fn)
			}
			stdin.Write([]byte("go\n"))
			rest, _ := rd.ReadString(0)
			if err := cmd.Wait(); err != nil {
				t.Fatalf("flip: %v\n%s", err, stderr.String())
			}
			if "inside\n"+rest != plain || stderr.Len() != 0 {
				t.Errorf("output %q (stderr %q), without the runtime %q", "inside\n"+rest, stderr.String(), plain)
			}
			r := openOutput(t, out)
			funcs := byName(t, r, r.Maps())
			checkCounts(t, funcs, map[string]ee{"main": {1, 1}, "mode_flip": {1, 1}, "outer_flip": {1, 1}, "held": {1, 1}, "other": {k, k}})
			noMismatch(t, r.Counters())
		})
	}
}

func mustRunInput(t testing.TB, lib, bin string, env []string, input string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	if lib != "" {
		cmd.Env = append(cmd.Env, "LD_PRELOAD="+lib)
	}
	cmd.Stdin = strings.NewReader(input)
	o, err := testutil.OutputBound(cmd)
	if err != nil {
		t.Fatalf("%s %v: %v", bin, args, err)
	}
	return string(o)
}

// flipSite turns the __fentry__ call at the start of fn (after endbr64)
// into its inert form in the running process pid: e8 -> 3d (cmp eax, imm32).
func flipSite(t testing.TB, pid int, bin, fn string) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, _ := f.Symbols()
	var addr uint64
	for _, s := range syms {
		if s.Name == fn && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			addr = s.Value
		}
	}
	if addr == 0 {
		t.Fatalf("no symbol %s", fn)
	}
	text := f.Section(".text")
	code, _ := text.Data()
	off := addr - text.Addr
	if string(code[off:off+4]) == "\xf3\x0f\x1e\xfa" {
		addr += 4
		off += 4
	}
	if code[off] != 0xe8 {
		t.Fatalf("%s: first instruction %x, want the e8 call to __fentry__", fn, code[off:off+6])
	}
	if f.Type == elf.ET_DYN {
		maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
		if err != nil {
			t.Fatal(err)
		}
		base := uint64(0)
		for _, m := range parseMaps(maps) {
			if m.path == bin && m.off == 0 {
				base = m.start
				break
			}
		}
		if base == 0 {
			t.Fatalf("%s not mapped in %d", bin, pid)
		}
		addr += base
	}
	mem, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", pid), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	cur := make([]byte, 1)
	if _, err := mem.ReadAt(cur, int64(addr)); err != nil || cur[0] != 0xe8 {
		t.Fatalf("%s at %#x: %x %v", fn, addr, cur, err)
	}
	if _, err := mem.WriteAt([]byte{0x3d}, int64(addr)); err != nil {
		t.Fatal(err)
	}
}

// TestFentryCoroutineMigrates: a coroutine that enters a probed function
// on one thread and returns from it on another (comigrate.c) returned
// through a hijacked slot whose saved address was on the first thread's
// return stack: the runtime stopped the program with SIGILL (review7's F6).
// Now the runtime's swapcontext carries the entry, and its shadow frame, to
// the thread that resumes the coroutine (D102): the program runs to its end
// and handle()'s one call is counted entered and exited, matched, with
// nothing dropped or given back; and with EDGEPROBE_FENTRY_EXITS=0 (nothing
// hijacked) every entry is counted, as before.
func TestFentryCoroutineMigrates(t *testing.T) {
	for _, cc := range []string{"gcc", "clang"} {
		for _, opt := range []string{"-O0", "-O2"} {
			t.Run(cc+opt, func(t *testing.T) {
				lib := buildRuntime(t, cc)
				bin := testutil.Build(t, testutil.Spec{Compiler: cc, Opt: opt, Sources: []string{"comigrate.c"}, NoInstr: true,
					Flags: []string{"-pthread"}, Profile: testutil.ProfileFentry, Name: "comigrate-" + cc + opt}).Path
				if got := mustRun(t, "", bin, nil); got != "done 7\n" {
					t.Fatalf("without the runtime: %q, want done 7", got)
				}
				out := filepath.Join(t.TempDir(), "exits")
				if got := mustRun(t, lib, bin, []string{"EDGEPROBE_OUTPUT=" + out}); got != "done 7\n" {
					t.Fatalf("with exit probes: %q, want done 7", got)
				}
				r := openOutput(t, out)
				fs := byName(t, r, r.Maps())
				checkCounts(t, fs, map[string]ee{"handle": {1, 1}, "leaf": {20, 20}})
				if h := fs["handle"]; h.Samples != 1 || h.Orphans != 0 || h.Unmatched != 0 || h.Open != 0 {
					t.Errorf("handle: %d samples, %d orphans, %d unmatched, %d open; want its one call timed", h.Samples, h.Orphans, h.Unmatched, h.Open)
				}
				noMismatch(t, r.Counters())
				if c := r.Counters(); c.FentryRestored != 0 {
					t.Errorf("%d hijacked slots given back; want handle's exit through its entry", c.FentryRestored)
				}
				out = filepath.Join(t.TempDir(), "entries")
				if got := mustRun(t, lib, bin, []string{"EDGEPROBE_OUTPUT=" + out, "EDGEPROBE_FENTRY_EXITS=0"}); got != "done 7\n" {
					t.Fatalf("entries only: %q, want done 7", got)
				}
				r = openOutput(t, out)
				checkCounts(t, byName(t, r, r.Maps()), map[string]ee{"handle": {1, 0}, "leaf": {20, 0}})
				noMismatch(t, r.Counters())
			})
		}
	}
}
