package elfscan

import (
	"errors"
	"fmt"
	"os/exec"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

const aliasReason = "an entry site cannot be told from an exit site"

// checkAgainstObjdump requires the probes (plus the sites refused because
// the hook's address carries both hook names) to be exactly objdump's
// unconditional branches to a hook, and every conditional one to be
// reported as skipped.
func checkAgainstObjdump(t *testing.T, fx testutil.Fixture, l *probelist.List, rep *Report) {
	t.Helper()
	refs := objdumpHookRefs(t, fx.Path)
	got := map[uint64]string{}
	for _, p := range l.Probes {
		got[uint64(p.Address)] = p.Hook
	}
	skipped := map[uint64]Skipped{}
	for _, s := range rep.Skipped {
		skipped[s.Address] = s
		if strings.Contains(s.Reason, aliasReason) {
			got[s.Address] = "alias"
		}
	}
	for a, h := range refs.sites {
		if g, ok := got[a]; !ok || g != h && g != "alias" {
			t.Errorf("objdump: %s at %#x; scan: %q\n%s", h, a, g, fx.Command)
		}
	}
	for a, h := range got {
		if _, ok := refs.sites[a]; !ok {
			t.Errorf("scan: %s site at %#x that objdump does not show\n%s", h, a, fx.Command)
		}
	}
	for a, h := range refs.conds {
		if _, ok := skipped[a]; !ok {
			t.Errorf("objdump: conditional branch to %s at %#x, not reported as skipped\n%s", h, a, fx.Command)
		}
	}
}

// checkNames requires every resolved probe to name a function start (per
// nm) and, without optimisation (no inlining), every probe to be resolved
// and to name its container.
func checkNames(t *testing.T, fx testutil.Fixture, spec testutil.Spec, l *probelist.List) {
	t.Helper()
	starts := functionStarts(t, fx.Path)
	resolved := 0
	for _, p := range l.Probes {
		if p.Resolved {
			resolved++
			if name, ok := starts[uint64(p.FunctionAddress)]; !ok {
				t.Errorf("probe %d at %s names %s at %s, which nm does not list as a function\n%s", p.ID, p.Address, p.Function, p.FunctionAddress, fx.Command)
			} else if p.Hook != hookEnterBare && !strings.Contains(name, p.Function) && !strings.Contains(p.Function, name) {
				// aliases at one address may differ; nm lists one of them
				if n2 := nameAt(starts, uint64(p.FunctionAddress)); n2 != p.Function {
					t.Logf("probe %d names %s, nm lists %s at that address", p.ID, p.Function, name)
				}
			}
		} else if p.Function != p.Container || p.FunctionAddress != 0 {
			t.Errorf("unresolved probe %d: function %s (%s), want its container %s and address 0", p.ID, p.Function, p.FunctionAddress, p.Container)
		}
		if spec.Opt == "-O0" && (!p.Resolved || p.Function != p.Container) {
			t.Errorf("-O0 probe %d at %s: function %s resolved=%v, want its container %s\n%s", p.ID, p.Address, p.Function, p.Resolved, p.Container, fx.Command)
		}
	}
	if len(l.Probes) > 0 && resolved*10 < len(l.Probes)*9 {
		t.Errorf("only %d of %d probes resolved\n%s", resolved, len(l.Probes), fx.Command)
	}
}

func nameAt(starts map[uint64]string, a uint64) string { return starts[a] }

// checkInlineNames compares the probe names with addr2line's inline chain,
// an independent reading of the DWARF inlining records: the innermost
// function at a resolved site is the function its hook reports.
func checkInlineNames(t *testing.T, fx testutil.Fixture, l *probelist.List) {
	t.Helper()
	testutil.RequireTool(t, "addr2line")
	var addrs []string
	var probes []probelist.Probe
	for _, p := range l.Probes {
		if p.Resolved && p.Hook != hookEnterBare {
			addrs = append(addrs, p.Address.String())
			probes = append(probes, p)
		}
	}
	if len(addrs) == 0 {
		return
	}
	out, err := exec.Command("addr2line", append([]string{"-f", "-i", "-a", "-e", fx.Path}, addrs...)...).Output()
	if err != nil {
		t.Fatalf("addr2line: %v", err)
	}
	innermost := map[string]string{}
	var cur string
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for i := 0; i < len(lines); i++ {
		if strings.HasPrefix(lines[i], "0x") {
			a, _ := strconv.ParseUint(lines[i][2:], 16, 64)
			cur = probelist.Hex(a).String()
			if i+1 < len(lines) {
				innermost[cur] = lines[i+1]
			}
		}
	}
	for _, p := range probes {
		if got := innermost[p.Address.String()]; got != p.Function {
			t.Errorf("probe %d at %s (%s hook in %s): named %s, addr2line's innermost function is %s\n%s", p.ID, p.Address, p.Kind, p.Container, p.Function, got, fx.Command)
		}
	}
}

// checkTwin requires a stripped build to have the sites of its unstripped
// twin.
func checkTwin(t *testing.T, spec testutil.Spec, l *probelist.List) {
	t.Helper()
	spec.Strip = false
	twin := testutil.Build(t, spec)
	tl, _ := mustScan(t, twin, Options{})
	a, b := siteOnly(keys(l)), siteOnly(keys(tl))
	if !reflect.DeepEqual(a, b) {
		t.Errorf("stripped build has sites\n%v\nunstripped twin has\n%v\n%s", a, b, twin.Command)
	}
}

// siteOnly drops naming from the keys: a stripped build knows fewer
// function starts.
func siteOnly(ks []siteKey) []siteKey {
	out := append([]siteKey(nil), ks...)
	for i := range out {
		out[i].Resolved, out[i].FunctionAddress = false, 0
	}
	return out
}

// checkCold runs the program, then a copy with every probe inert, and
// requires the same output; rescanning the copy must give the probe list
// back, less the sites whose inert form is a nop.
func checkCold(t *testing.T, fx testutil.Fixture, l *probelist.List, args ...string) (orig, cold runResult) {
	t.Helper()
	orig = run(t, fx.Path, args...)
	coldPath := coldCopy(t, fx.Path, l)
	cold = run(t, coldPath, args...)
	if orig.stdout != cold.stdout || orig.code != cold.code {
		t.Errorf("cold copy printed %q (exit %d), original %q (exit %d)\n%s", cold.stdout, cold.code, orig.stdout, orig.code, fx.Command)
	}
	checkRescan(t, fx, l, coldPath)
	return orig, cold
}

// checkRescan requires the scan of a cold copy to give the probe list back,
// less the call sites whose inert form is a nop.
func checkRescan(t *testing.T, fx testutil.Fixture, l *probelist.List, coldPath string) {
	t.Helper()
	cl, crep, err := Scan(coldPath, Options{Placeholder: l.Placeholder})
	want := *l
	want.Probes = nil
	for _, p := range l.Probes {
		if p.Placeholder == probelist.PlaceholderFlip || !isCallEncoding(p.Encoding) {
			p.ID = len(want.Probes)
			want.Probes = append(want.Probes, p)
		}
	}
	if want.Probes == nil {
		if !errors.Is(err, ErrNoHookSites) && (err != nil || len(cl.Probes) != 0) {
			t.Errorf("rescan of a cold copy with only nop sites: %v, %d probes; want none", err, len(cl.Probes))
		}
		return
	}
	if err != nil {
		t.Fatalf("rescan of the cold copy: %v", err)
	}
	want.Binary.Path = cl.Binary.Path
	if !reflect.DeepEqual(&want, cl) {
		t.Errorf("rescan of the cold copy differs:\n got %+v\nwant %+v\n%s", cl.Probes, want.Probes, fx.Command)
	}
	for _, s := range crep.Sites {
		if s.State != "inert" {
			t.Errorf("cold copy: site at %#x found %s", s.Address, s.State)
		}
	}
}

func TestMatrixBasic(t *testing.T) {
	for _, spec := range testutil.Matrix("basic.c") {
		t.Run(spec.String(), func(t *testing.T) {
			fx := testutil.Build(t, spec)
			l, rep, err := Scan(fx.Path, Options{})
			if spec.Static && spec.Strip {
				// glibc's static hooks are known only by .symtab.
				if !errors.Is(err, ErrNoHookSites) {
					t.Fatalf("stripped static: got %v, want ErrNoHookSites\n%s", err, fx.Command)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, fx.Command)
			}
			if err := l.Validate(); err != nil {
				t.Fatal(err)
			}
			if spec.Static {
				// glibc defines both hooks as one empty function.
				if len(l.Probes) != 0 || len(rep.Skipped) == 0 {
					t.Errorf("static glibc hooks: %d probes, %d skipped; want 0 and the alias sites", len(l.Probes), len(rep.Skipped))
				}
			} else if len(l.Probes) == 0 {
				t.Fatalf("no probes\n%s", fx.Command)
			}
			if spec.Strip {
				checkTwin(t, spec, l)
			} else {
				checkAgainstObjdump(t, fx, l, rep)
				checkNames(t, fx, spec, l)
				checkInlineNames(t, fx, l)
				if !strings.HasPrefix(rep.FunctionSource, "symtab") {
					t.Errorf("function source %q", rep.FunctionSource)
				}
			}
			for _, p := range l.Probes {
				if p.Placeholder != probelist.PlaceholderFlip {
					t.Errorf("probe %d: placeholder %s (%s) for a hook the compiler could not see", p.ID, p.Placeholder, rep.Sites[p.ID].NopReason)
				}
			}
			checkCold(t, fx, l)
		})
	}
}

var hooksLine = regexp.MustCompile(`hooks enters=(\d+) exits=(\d+)`)

// TestMatrixDefinedHooks links counting hooks into the program, so each hook
// call is visible at run time: with every probe inert the program must count
// none, which proves the scan found every site that runs, and its output must
// not change.
func TestMatrixDefinedHooks(t *testing.T) {
	for _, spec := range testutil.Matrix("basic.c", "hooks.c") {
		t.Run(spec.String(), func(t *testing.T) {
			fx := testutil.Build(t, spec)
			if spec.Strip {
				// Only .dynsym can name the hooks: the linker exports
				// them from a PIE (libc defines the same symbols), not
				// from a static executable.
				l, _, err := Scan(fx.Path, Options{})
				if exported(t, fx.Path) {
					if err != nil {
						t.Fatalf("stripped with exported hooks: %v\n%s", err, fx.Command)
					}
					checkTwin(t, spec, l)
				} else if !errors.Is(err, ErrNoHookSites) {
					t.Fatalf("stripped with private hooks: got %v, want ErrNoHookSites\n%s", err, fx.Command)
				}
				return
			}
			for _, ph := range []string{probelist.PlaceholderFlip, probelist.PlaceholderNop} {
				l, rep := mustScan(t, fx, Options{Placeholder: ph})
				checkAgainstObjdump(t, fx, l, rep)
				checkNames(t, fx, spec, l)
				orig, cold := checkCold(t, fx, l)
				m := hooksLine.FindStringSubmatch(orig.stderr)
				if m == nil || m[1] == "0" || m[2] == "0" {
					t.Fatalf("original run: stderr %q, want hook counts\n%s", orig.stderr, fx.Command)
				}
				if m := hooksLine.FindStringSubmatch(cold.stderr); m == nil || m[1] != "0" || m[2] != "0" {
					t.Errorf("%s cold copy still calls hooks: %q\n%s", ph, cold.stderr, fx.Command)
				}
			}
		})
	}
}

// TestInlinedNames pins the case the naming walk exists for: at -O2 the
// hook calls of the inlined sq land in sum_squares, reporting sq.
func TestInlinedNames(t *testing.T) {
	for _, cc := range []string{"gcc", "clang"} {
		fx := testutil.Build(t, testutil.Spec{Compiler: cc, Opt: "-O2", Sources: []string{"basic.c"}, PIE: testutil.Bool(true)})
		l, _ := mustScan(t, fx, Options{})
		kinds := map[string]int{}
		for _, p := range l.Probes {
			if p.Container == "sum_squares" && p.Function == "sq" && p.Resolved {
				kinds[p.Kind]++
			}
		}
		if kinds[probelist.KindEntry] == 0 || kinds[probelist.KindExit] == 0 {
			t.Errorf("%s: sq probes in sum_squares: %v, want entry and exit\n%s", cc, kinds, fx.Command)
		}
	}
}

func TestSharedLibrary(t *testing.T) {
	for _, cc := range []string{"gcc", "clang"} {
		for _, opt := range []string{"-O0", "-O2"} {
			for _, strip := range []bool{false, true} {
				spec := testutil.Spec{Compiler: cc, Opt: opt, Sources: []string{"lib.c"}, Shared: true, Strip: strip, LDFlags: []string{"-Wl,-soname,libfix.so.1"}}
				t.Run(spec.String(), func(t *testing.T) {
					fx := testutil.Build(t, spec)
					l, rep := mustScan(t, fx, Options{})
					if l.Binary.Type != "dyn" || l.Binary.Soname != "libfix.so.1" || l.Binary.BuildID == "" {
						t.Errorf("binary %+v", l.Binary)
					}
					if strip {
						checkTwin(t, spec, l)
						if !strings.Contains(rep.FunctionSource, "eh_frame") {
							t.Errorf("stripped library: function source %q, want eh_frame to add the hidden and static functions", rep.FunctionSource)
						}
						return
					}
					checkAgainstObjdump(t, fx, l, rep)
					checkNames(t, fx, spec, l)
					named := map[string]bool{}
					for _, p := range l.Probes {
						named[p.Function] = true
					}
					for _, fn := range []string{"lib_static", "lib_hidden", "lib_entry"} {
						if !named[fn] {
							t.Errorf("no probe names %s\n%s", fn, fx.Command)
						}
					}
				})
			}
		}
	}
}

// TestFlagsLive scans flags.S, whose hooks preserve the flags, and checks
// each site's placeholder; then it runs the program with the chosen inert
// forms (same exit status) and with every call site flipped regardless
// (different status), which shows the analysis is what keeps it correct.
func TestFlagsLive(t *testing.T) {
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"flags.S", "flagshooks.S"}, PIE: testutil.Bool(false), Flags: []string{"-nostdlib"}})
	l, rep := mustScan(t, fx, Options{})
	want := map[string]string{ // function/kind -> placeholder
		"live_jcc/entry":       "nop",
		"live_jcc/exit":        "flip",
		"live_after_jmp/entry": "nop",
		"live_adc/entry":       "nop",
		"dead_cmp/entry":       "flip",
		"dead_cmp/exit":        "flip",
		"unknown_long/entry":   "nop",
	}
	got := map[string]string{}
	for _, p := range l.Probes {
		got[p.Function+"/"+p.Kind] = p.Placeholder
		if p.Placeholder == probelist.PlaceholderNop && rep.Sites[p.ID].NopReason == "" {
			t.Errorf("probe %d: nop without a reason", p.ID)
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("placeholders %v, want %v", got, want)
	}
	var reasons []string
	for _, s := range rep.Skipped {
		if s.Container != "refs" {
			t.Errorf("unexpected skip %+v", s)
		}
		reasons = append(reasons, s.Reason)
	}
	sort.Strings(reasons)
	for i, w := range []string{"branch to a hook in an encoding", "call or jump through a register", "conditional branch", "has the flip-inert form", "hook address taken"} {
		if i >= len(reasons) || !strings.HasPrefix(reasons[i], w) {
			t.Errorf("skipped reasons %q, want one starting %q", reasons, w)
		}
	}
	orig, _ := checkCold(t, fx, l)
	if orig.code != 31 {
		t.Fatalf("flags fixture exits %d, want 31", orig.code)
	}
	forced := *l
	forced.Probes = nil
	for _, p := range l.Probes {
		p.Inert, _ = probelist.InertForm(p.Encoding, p.Active, probelist.PlaceholderFlip)
		forced.Probes = append(forced.Probes, p)
	}
	if r := run(t, coldCopy(t, fx.Path, &forced)); r.code == orig.code {
		t.Errorf("flipping the flags-live sites did not change the exit status (%d): the fixture does not test the analysis", r.code)
	}
}

// TestSameUnitHook: with the hook defined in the site's compilation unit
// the nop placeholder is used even where the forward decode sees dead
// flags.
func TestSameUnitHook(t *testing.T) {
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"samecu.c"}, Opt: "-O1"})
	l, rep := mustScan(t, fx, Options{})
	for _, p := range l.Probes {
		if p.Placeholder != probelist.PlaceholderNop || !strings.Contains(rep.Sites[p.ID].NopReason, "same compilation unit") {
			t.Errorf("probe %d (%s in %s): placeholder %s (%q)", p.ID, p.Kind, p.Container, p.Placeholder, rep.Sites[p.ID].NopReason)
		}
	}
	if len(l.Probes) == 0 {
		t.Fatal("no probes")
	}
	_, cold := checkCold(t, fx, l)
	if !strings.Contains(cold.stderr, "hooks calls=0") {
		t.Errorf("cold copy: %q", cold.stderr)
	}
}

func TestEntryBare(t *testing.T) {
	fx := testutil.Build(t, testutil.Spec{Compiler: "clang", Sources: []string{"bare.c"}, NoInstr: true, Flags: []string{"-finstrument-function-entry-bare"}})
	l, rep := mustScan(t, fx, Options{})
	checkAgainstObjdump(t, fx, l, rep)
	if len(l.Probes) == 0 {
		t.Fatal("no probes")
	}
	for _, p := range l.Probes {
		if p.Hook != hookEnterBare || p.Kind != probelist.KindEntry || !p.Resolved || p.Function != p.Container {
			t.Errorf("probe %+v", p)
		}
	}
	_, cold := checkCold(t, fx, l)
	if !strings.Contains(cold.stderr, "hooks enters=0") {
		t.Errorf("cold copy: %q", cold.stderr)
	}
}

func TestErrors(t *testing.T) {
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}})
	data := readFile(t, fx.Path)
	patched := func(name string, edit func([]byte) []byte) string {
		b := edit(append([]byte(nil), data...))
		return writeTemp(t, name, b)
	}
	obj := testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}, Flags: []string{"-c"}, Name: "basic.o"})
	plain := testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}, NoInstr: true})
	for _, c := range []struct {
		name, path string
		want       error
	}{
		{"source file", testutil.FixtureDir(t) + "/basic.c", ErrNotELF},
		{"empty", patched("empty", func(b []byte) []byte { return nil }), ErrNotELF},
		{"32-bit", patched("elf32", func(b []byte) []byte { b[4] = 1; return b }), ErrNotX86_64},
		{"big-endian", patched("msb", func(b []byte) []byte { b[5] = 2; return b }), ErrNotX86_64},
		{"aarch64", patched("arm", func(b []byte) []byte { b[18], b[19] = 183, 0; return b }), ErrNotX86_64},
		{"header only", patched("hdr", func(b []byte) []byte { return b[:64] }), ErrTruncated},
		{"half", patched("half", func(b []byte) []byte { return b[:len(b)/2] }), ErrTruncated},
		{"relocatable", obj.Path, ErrUnsupported},
		{"not instrumented", plain.Path, ErrNoHookSites},
	} {
		_, _, err := Scan(c.path, Options{})
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
			continue
		}
		var se *Error
		if !errors.As(err, &se) || !strings.Contains(err.Error(), c.path) {
			t.Errorf("%s: error %q is not an *Error naming the file", c.name, err)
		}
	}
	if _, _, err := Scan(fx.Path, Options{Placeholder: "bogus"}); err == nil {
		t.Error("bogus placeholder accepted")
	}
}

// TestEhFrameMatchesReadelf compares the FDE ranges with readelf's
// independent decoding of .eh_frame.
func TestEhFrameMatchesReadelf(t *testing.T) {
	testutil.RequireTool(t, "readelf")
	for _, spec := range []testutil.Spec{
		{Sources: []string{"basic.c"}, Strip: true},
		{Sources: []string{"basic.c"}, Static: true, PIE: testutil.Bool(false)},
		{Compiler: "clang", Sources: []string{"lib.c"}, Shared: true},
	} {
		fx := testutil.Build(t, spec)
		out, err := exec.Command("readelf", "--debug-dump=frames", fx.Path).Output()
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, m := range regexp.MustCompile(`FDE cie=\w+ pc=(\w+)\.\.(\w+)`).FindAllStringSubmatch(string(out), -1) {
			lo, _ := strconv.ParseUint(m[1], 16, 64)
			hi, _ := strconv.ParseUint(m[2], 16, 64)
			if hi > lo {
				want = append(want, fmt.Sprintf("%x-%x", lo, hi))
			}
		}
		o, err := load(readFile(t, fx.Path), fx.Path)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range o.fdes {
			got = append(got, fmt.Sprintf("%x-%x", d.start, d.end))
		}
		if o.ehErr != nil || len(want) == 0 || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: FDEs %v (err %v), readelf %v", spec, got, o.ehErr, want)
		}
	}
}
