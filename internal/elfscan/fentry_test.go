package elfscan

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// The fentry provider's tests: programs compiled with -pg -mfentry (linked
// without -pg), by gcc and clang, C and C++, checked against objdump, the
// symbol table and gcc's __mcount_loc, and run cold.

// objdumpCalls is the independent count: objdump's calls (and other
// references) whose target it names as __fentry__ or mcount, outside the PLTs.
type objdumpCalls struct {
	fentry map[uint64]bool // call ... <__fentry__...>
	other  map[uint64]bool // any other instruction naming __fentry__, mcount or _mcount as its target
}

var objdumpProfTarget = regexp.MustCompile(`<(__fentry__|_?mcount)(@plt|@[A-Z_0-9.]+)?>$`)

func objdumpFentry(t *testing.T, path string) objdumpCalls {
	t.Helper()
	c := objdumpCalls{map[uint64]bool{}, map[uint64]bool{}}
	objdumpTargets(t, path, objdumpProfTarget, func(addr uint64, mnemonic, target string) {
		if mnemonic == "call" && target == "__fentry__" {
			c.fentry[addr] = true
		} else {
			c.other[addr] = true
		}
	})
	return c
}

// mcountLoc reads the __mcount_loc table with debug/elf: the section's
// contents, which the linker fills with link-time addresses (PIEs carry a
// relative relocation with the same value). nil when there is no table.
func mcountLoc(t *testing.T, path string) []uint64 {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sec := f.Section("__mcount_loc")
	if sec == nil {
		return nil
	}
	data, err := sec.Data()
	if err != nil || len(data)%8 != 0 {
		t.Fatalf("__mcount_loc: %v, %d bytes", err, len(data))
	}
	out := []uint64{}
	for i := 0; i < len(data); i += 8 {
		out = append(out, binary.LittleEndian.Uint64(data[i:]))
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// checkFentrySites requires the fentry probes to be exactly objdump's calls
// to __fentry__ (and __mcount_loc's entries, when the build has the table),
// each the first instruction of a function symbol or right after its
// endbr64, named after that function. A stripped build is compared with
// the disassembly and symbols of its unstripped twin (same addresses):
// objdump names the GOT slot of a `call *__fentry__@GOTPCREL(%rip)` only
// from the symbol table.
func checkFentrySites(t *testing.T, spec testutil.Spec, fx testutil.Fixture, l *probelist.List, rep *Report) {
	t.Helper()
	ref := fx.Path
	if spec.Strip {
		spec.Strip = false
		ref = testutil.Build(t, spec).Path
	}
	calls := objdumpFentry(t, ref)
	data := readFile(t, fx.Path)
	starts := functionStarts(t, ref)
	got := map[uint64]bool{}
	var addrs []uint64
	for _, p := range l.Probes {
		if p.Provider != probelist.ProviderFentry {
			continue
		}
		a := uint64(p.Address)
		got[a], addrs = true, append(addrs, a)
		if p.Kind != probelist.KindEntry || p.Hook != hookFentry || !p.Resolved || p.Function != p.Container {
			t.Errorf("fentry probe %d: kind %s hook %s resolved %v function %s container %s", p.ID, p.Kind, p.Hook, p.Resolved, p.Function, p.Container)
		}
		if !calls.fentry[a] {
			t.Errorf("fentry probe %d at %#x: objdump shows no call to __fentry__ there\n%s", p.ID, a, fx.Command)
		}
		entry := uint64(p.FunctionAddress)
		nested := entry+2 == a && bytes.Equal(data[p.Offset-2:p.Offset], pushR10)
		if entry != a && !nested && !(entry+4 == a && bytes.Equal(data[p.Offset-4:p.Offset], endbr64)) {
			t.Errorf("fentry probe %d at %#x: function %s starts at %#x, and not with endbr64 just before the site", p.ID, a, p.Function, entry)
		}
		if name, ok := starts[entry]; !ok {
			t.Errorf("fentry probe %d at %#x: nm lists no function at %#x\n%s", p.ID, a, entry, fx.Command)
		} else if name != p.Function && !spec.Strip {
			t.Logf("fentry probe %d names %s, nm lists %s at that address", p.ID, p.Function, name)
		}
	}
	for a := range calls.fentry {
		if !got[a] {
			t.Errorf("objdump: call to __fentry__ at %#x, not an fentry probe\n%s", a, fx.Command)
		}
	}
	if len(calls.fentry) == 0 {
		t.Fatalf("objdump shows no call to __fentry__: the fixture is not built with -pg -mfentry\n%s", fx.Command)
	}
	sort.Slice(addrs, func(i, j int) bool { return addrs[i] < addrs[j] })
	if loc := mcountLoc(t, fx.Path); loc != nil {
		if !reflect.DeepEqual(loc, addrs) {
			t.Errorf("__mcount_loc lists %x, the fentry probes are at %x\n%s", loc, addrs, fx.Command)
		}
		if c := rep.McountLoc; c == nil || !c.OK() || c.Matched != len(addrs) || c.Entries != len(loc) {
			t.Errorf("report's __mcount_loc check: %+v, want %d entries all matched", c, len(loc))
		}
	} else if rep.McountLoc != nil {
		t.Errorf("report has a __mcount_loc check %+v for an object without the table", rep.McountLoc)
	}
}

// uninstrumented builds spec's program without any instrumentation and
// returns its output, the reference a cold binary must reproduce.
func uninstrumented(t *testing.T, spec testutil.Spec, args ...string) runResult {
	t.Helper()
	var srcs []string
	for _, s := range spec.Sources {
		if !strings.HasSuffix(s, ".S") {
			srcs = append(srcs, s)
		}
	}
	spec.Sources, spec.NoInstr, spec.Profile, spec.Strip, spec.Flags = srcs, true, "", false, nil
	return run(t, testutil.Build(t, spec).Path, args...)
}

var fentryCalls = regexp.MustCompile(`fentry calls=(\d+)`)

// TestFentryMatrix scans, coldpatches and runs -pg -mfentry builds: both
// compilers and code models, C and C++, our own __fentry__, -fcf-protection
// and -mrecord-mcount. The C rows run at -O2, and with EDGEPROBE_LONG at
// every level; -O0 stays covered by the C++ and -mrecord-mcount rows.
func TestFentryMatrix(t *testing.T) {
	var specs []testutil.Spec
	fentry := func(s testutil.Spec) testutil.Spec {
		s.Profile, s.NoInstr = testutil.ProfileFentry, true
		if s.Sources == nil {
			s.Sources = []string{"basic.c"}
		}
		return s
	}
	pie, nopie := testutil.Bool(true), testutil.Bool(false)
	for _, cc := range []string{"gcc", "clang"} {
		for _, opt := range testutil.Opts("-O2") {
			specs = append(specs,
				fentry(testutil.Spec{Compiler: cc, Opt: opt, PIE: pie}),
				fentry(testutil.Spec{Compiler: cc, Opt: opt, PIE: nopie}),
				fentry(testutil.Spec{Compiler: cc, Opt: opt, PIE: pie, NoPLT: true}),
				// our counting __fentry__, defined in the program: direct and addr32 calls
				fentry(testutil.Spec{Compiler: cc, Opt: opt, PIE: pie, Sources: []string{"basic.c", "fentry_count.S"}}),
				fentry(testutil.Spec{Compiler: cc, Opt: opt, PIE: nopie, Sources: []string{"basic.c", "fentry_count.S"}}),
			)
		}
		cxx := map[string]string{"gcc": "g++", "clang": "clang++"}[cc]
		specs = append(specs,
			fentry(testutil.Spec{Compiler: cc, PIE: pie, Strip: true}),
			fentry(testutil.Spec{Compiler: cc, PIE: pie, NoPLT: true, Strip: true}),
			fentry(testutil.Spec{Compiler: cc, PIE: nopie, Static: true}),
			fentry(testutil.Spec{Compiler: cc, PIE: pie, Flags: []string{"-fcf-protection"}}),
			fentry(testutil.Spec{Compiler: cc, PIE: pie, Flags: []string{"-fcf-protection"}, Sources: []string{"basic.c", "fentry_count.S"}}),
			fentry(testutil.Spec{Compiler: cxx, Opt: "-O0", PIE: pie, Sources: []string{"exc.cc"}}),
			fentry(testutil.Spec{Compiler: cxx, Opt: "-O2", PIE: pie, Sources: []string{"exc.cc"}}),
			fentry(testutil.Spec{Compiler: cxx, Opt: "-O2", PIE: nopie, Sources: []string{"exc.cc", "fentry_count.S"}}),
			fentry(testutil.Spec{Compiler: cxx, Opt: "-O2", PIE: pie, Strip: true, Sources: []string{"exc.cc"}}),
		)
	}
	// gcc's -mrecord-mcount table (clang 14 rejects the flag on x86-64).
	rec := []string{"-mrecord-mcount"}
	specs = append(specs,
		fentry(testutil.Spec{Compiler: "gcc", Opt: "-O2", PIE: pie, Flags: rec}),
		fentry(testutil.Spec{Compiler: "gcc", Opt: "-O0", PIE: nopie, Flags: rec}),
		fentry(testutil.Spec{Compiler: "gcc", Opt: "-O2", PIE: pie, NoPLT: true, Strip: true, Flags: rec}),
		fentry(testutil.Spec{Compiler: "gcc", Opt: "-O2", PIE: nopie, Flags: append([]string{"-fcf-protection"}, rec...), Sources: []string{"basic.c", "fentry_count.S"}}),
		fentry(testutil.Spec{Compiler: "gcc", Opt: "-O2", PIE: nopie, Static: true, Flags: rec}),
		fentry(testutil.Spec{Compiler: "g++", Opt: "-O2", PIE: pie, Flags: rec, Sources: []string{"exc.cc"}}),
	)
	for _, spec := range specs {
		name := spec.String()
		if len(spec.Flags) > 0 {
			name += strings.Join(spec.Flags, "")
		}
		if spec.Sources[0] != "basic.c" || len(spec.Sources) > 1 {
			name += "-" + strings.Join(spec.Sources, "+")
		}
		t.Run(name, func(t *testing.T) {
			fx := testutil.Build(t, spec)
			l, rep := mustScan(t, fx, Options{})
			if len(l.Probes) == 0 {
				t.Fatalf("no probes\n%s", fx.Command)
			}
			for _, p := range l.Probes {
				if p.Provider != probelist.ProviderFentry || p.Placeholder != probelist.PlaceholderFlip {
					t.Errorf("probe %d: provider %s placeholder %s (%s)", p.ID, p.Provider, p.Placeholder, rep.Sites[p.ID].NopReason)
				}
			}
			for _, s := range rep.Skipped {
				if s.Hook == hookFentry || hookProvider(s.Hook) == providerMcount {
					t.Errorf("skipped a profiling-hook reference the compiler emitted: %+v\n%s", s, fx.Command)
				}
			}
			if spec.Strip {
				checkTwin(t, spec, l)
			}
			checkFentrySites(t, spec, fx, l, rep)
			want := uninstrumented(t, spec, "12")
			orig, cold := checkCold(t, fx, l, "12")
			if cold.stdout != want.stdout || cold.code != want.code {
				t.Errorf("cold binary printed %q (exit %d), the uninstrumented build %q (exit %d)", cold.stdout, cold.code, want.stdout, want.code)
			}
			if strings.Contains(strings.Join(spec.Sources, " "), "fentry_count.S") {
				m := fentryCalls.FindStringSubmatch(orig.stderr)
				if m == nil || m[1] == "0" {
					t.Errorf("original run: stderr %q, want a positive fentry count", orig.stderr)
				}
				if m := fentryCalls.FindStringSubmatch(cold.stderr); m == nil || m[1] != "0" {
					t.Errorf("cold copy still calls __fentry__: %q", cold.stderr)
				}
			}
		})
	}
}

// TestFentryNop: --placeholder nop gives fentry call sites the multi-byte
// NOP, and the program still runs without reaching __fentry__.
func TestFentryNop(t *testing.T) {
	for _, cc := range []string{"gcc", "clang"} {
		spec := testutil.Spec{Compiler: cc, Sources: []string{"basic.c", "fentry_count.S"}, NoInstr: true, Profile: testutil.ProfileFentry, NoPLT: true}
		fx := testutil.Build(t, spec)
		l, _ := mustScan(t, fx, Options{Placeholder: probelist.PlaceholderNop})
		for _, p := range l.Probes {
			if p.Placeholder != probelist.PlaceholderNop || p.DifferingBytes() < 2 {
				t.Errorf("%s probe %d: placeholder %s, inert %s", cc, p.ID, p.Placeholder, p.Inert)
			}
		}
		_, cold := checkCold(t, fx, l, "12")
		if m := fentryCalls.FindStringSubmatch(cold.stderr); m == nil || m[1] != "0" {
			t.Errorf("%s nop-cold copy: %q", cc, cold.stderr)
		}
	}
}

// TestFentryShared: a shared library built -fPIC -pg -mfentry calls
// __fentry__ through its GOT (gcc) or PLT (clang).
func TestFentryShared(t *testing.T) {
	for _, cc := range []string{"gcc", "clang"} {
		for _, strip := range []bool{false, true} {
			spec := testutil.Spec{Compiler: cc, Sources: []string{"lib.c"}, Shared: true, Strip: strip, NoInstr: true,
				Profile: testutil.ProfileFentry, LDFlags: []string{"-Wl,-soname,libfix.so.1"}}
			if cc == "gcc" {
				spec.Flags = []string{"-mrecord-mcount"}
			}
			t.Run(spec.String(), func(t *testing.T) {
				fx := testutil.Build(t, spec)
				l, rep := mustScan(t, fx, Options{})
				checkFentrySites(t, spec, fx, l, rep)
				if strip {
					checkTwin(t, spec, l)
				} else {
					named := map[string]bool{}
					for _, p := range l.Probes {
						named[p.Function] = true
					}
					// lib_static is inlined at -O2: an inlined function has
					// no entry of its own, so no fentry probe (unlike cyg).
					for _, fn := range []string{"lib_hidden", "lib_entry"} {
						if !named[fn] {
							t.Errorf("no fentry probe names %s\n%s", fn, fx.Command)
						}
					}
				}
				checkRescan(t, fx, l, coldCopy(t, fx.Path, l))
			})
		}
	}
}

// TestBothProviders: -finstrument-functions -pg -mfentry gives each function
// an fentry site at its entry and the cyg entry and exit sites.
func TestBothProviders(t *testing.T) {
	for _, cc := range []string{"gcc", "clang"} {
		spec := testutil.Spec{Compiler: cc, Sources: []string{"basic.c", "hooks.c", "fentry_count.S"}, PIE: testutil.Bool(true), Profile: testutil.ProfileFentry}
		t.Run(spec.String(), func(t *testing.T) {
			fx := testutil.Build(t, spec)
			l, rep := mustScan(t, fx, Options{})
			n := map[string]int{}
			for _, p := range l.Probes {
				n[p.Provider]++
			}
			if n[probelist.ProviderCyg] == 0 || n[probelist.ProviderFentry] == 0 {
				t.Fatalf("probes by provider %v, want both\n%s", n, fx.Command)
			}
			// The cyg probes, checked as in TestMatrixDefinedHooks; the
			// hooks themselves are not instrumented.
			cyg := *l
			cyg.Probes = nil
			for _, p := range l.Probes {
				if p.Provider == probelist.ProviderCyg {
					cyg.Probes = append(cyg.Probes, p)
				}
			}
			checkAgainstObjdump(t, fx, &cyg, rep)
			checkFentrySites(t, spec, fx, l, rep)
			orig, cold := checkCold(t, fx, l, "12")
			if m := hooksLine.FindStringSubmatch(cold.stderr); m == nil || m[1] != "0" || m[2] != "0" {
				t.Errorf("cold copy still calls the cyg hooks: %q", cold.stderr)
			}
			if m := fentryCalls.FindStringSubmatch(cold.stderr); m == nil || m[1] != "0" {
				t.Errorf("cold copy still calls __fentry__: %q", cold.stderr)
			}
			if m := fentryCalls.FindStringSubmatch(orig.stderr); m == nil || m[1] == "0" {
				t.Errorf("original: %q", orig.stderr)
			}
		})
	}
}

// TestFentryRefs: references to __fentry__ that are not entry calls, and
// mcount calls, are reported and skipped; a __mcount_loc that disagrees with
// the sites is reported, and changes nothing in the list.
func TestFentryRefs(t *testing.T) {
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"fentry_refs.S"}, PIE: testutil.Bool(false), Static: true, NoInstr: true, Flags: []string{"-nostdlib"}})
	l, rep := mustScan(t, fx, Options{})
	var got []string
	for _, p := range l.Probes {
		got = append(got, p.Provider+"/"+p.Kind+"/"+p.Function)
	}
	if want := []string{"fentry/entry/_start", "fentry/entry/with_endbr"}; !reflect.DeepEqual(got, want) {
		t.Errorf("probes %v, want %v", got, want)
	}
	skipped := map[string]string{}
	for _, s := range rep.Skipped {
		skipped[s.Container] = s.Reason
	}
	for fn, want := range map[string]string{
		"late":   "not a function's entry instruction",
		"tail":   "jump to __fentry__",
		"old_pg": "call to mcount",
	} {
		if !strings.Contains(skipped[fn], want) {
			t.Errorf("%s: skipped %q, want a reason containing %q", fn, skipped[fn], want)
		}
	}
	if len(skipped) != 3 {
		t.Errorf("skipped %v, want late, tail and old_pg", skipped)
	}
	c := rep.McountLoc
	if c == nil || c.OK() || c.Entries != 2 || c.Matched != 1 || len(c.NotSites) != 1 || len(c.Unlisted) != 1 {
		t.Fatalf("__mcount_loc check %+v, want 2 entries, 1 matched, 1 not a site, 1 unlisted", c)
	}
	syms := functionStarts(t, fx.Path)
	byName := map[string]uint64{}
	for a, n := range syms {
		byName[n] = a
	}
	if c.NotSites[0] != byName["late"]+1 || c.Unlisted[0] != byName["with_endbr"]+4 {
		t.Errorf("not sites %x (late is at %#x), unlisted %x (with_endbr at %#x)", c.NotSites, byName["late"], c.Unlisted, byName["with_endbr"])
	}
	checkCold(t, fx, l)
}

// TestMcountOnly: -pg without -mfentry calls mcount after the prologue:
// every call is reported, none is a probe.
func TestMcountOnly(t *testing.T) {
	for _, cc := range []string{"gcc", "clang"} {
		spec := testutil.Spec{Compiler: cc, Sources: []string{"basic.c"}, NoInstr: true, Profile: testutil.ProfileMcount}
		fx := testutil.Build(t, spec)
		l, rep, err := Scan(fx.Path, Options{})
		if err != nil {
			t.Fatalf("%s: %v\n%s", cc, err, fx.Command)
		}
		calls := objdumpFentry(t, fx.Path)
		if len(l.Probes) != 0 || len(calls.fentry) != 0 {
			t.Errorf("%s: %d probes, %d fentry calls; want none", cc, len(l.Probes), len(calls.fentry))
		}
		n := 0
		for _, s := range rep.Skipped {
			if s.Reason == mcountReason && calls.other[s.Address] {
				n++
			}
		}
		if n == 0 || n != len(calls.other) || n != len(rep.Skipped) {
			t.Errorf("%s: %d mcount calls reported of objdump's %d (%d skipped)\n%s", cc, n, len(calls.other), len(rep.Skipped), fx.Command)
		}
	}
}

// FuzzMcountLoc: the table parser takes any bytes without panicking, and
// reads exactly one address per 8 bytes.
func FuzzMcountLoc(f *testing.F) {
	f.Add([]byte{}, uint64(0), false)
	f.Add([]byte{0x70, 0x11, 0, 0, 0, 0, 0, 0, 0x50, 0x10, 0, 0, 0, 0, 0, 0}, uint64(0x200b), true)
	f.Add([]byte{1, 2, 3}, uint64(0xfffffffffffffff8), true)
	f.Fuzz(func(t *testing.T, data []byte, addr uint64, relocated bool) {
		var rel func(uint64) (uint64, bool)
		if relocated {
			rel = func(at uint64) (uint64, bool) { return at ^ 0x55, at%16 == 0 }
		}
		got, err := parseMcountLoc(data, addr, rel)
		if err != nil {
			if len(data)%8 == 0 {
				t.Fatalf("refused %d bytes: %v", len(data), err)
			}
			return
		}
		if len(got) != len(data)/8 {
			t.Fatalf("%d addresses from %d bytes", len(got), len(data))
		}
	})
}

// TestFentryNested: gcc brackets a nested function's fentry call with
// push/pop %r10 (the static chain); the call is still that function's entry
// probe, and the cold program computes the same.
func TestFentryNested(t *testing.T) {
	for _, opt := range []string{"-O0", "-O2"} {
		spec := testutil.Spec{Compiler: "gcc", Opt: opt, Sources: []string{"nested.c"}, Profile: testutil.ProfileFentry, NoInstr: true}
		fx := testutil.Build(t, spec)
		l, rep, err := Scan(fx.Path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		checkFentrySites(t, spec, fx, l, rep)
		var inner *probelist.Probe
		for i := range l.Probes {
			if strings.HasPrefix(l.Probes[i].Function, "inner") {
				inner = &l.Probes[i]
			}
		}
		if inner == nil {
			t.Fatalf("%s: no probe for the nested function (skipped: %+v)\n%s", opt, rep.Skipped, fx.Command)
		}
		if uint64(inner.Address) != uint64(inner.FunctionAddress)+2 {
			t.Errorf("%s: nested probe at %s, function at %s: want the call right after push %%r10", opt, inner.Address, inner.FunctionAddress)
		}
	}
}
