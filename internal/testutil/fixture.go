package testutil

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// Spec says how to build one fixture. The zero value of each field is the
// compiler's default, except Compiler, which defaults to gcc.
type Spec struct {
	Compiler string   // "gcc" or "clang" (or "g++"/"clang++" for C++ sources)
	Sources  []string // file names under testdata/fixtures
	Opt      string   // "-O0".."-O3", "-Os"; default -O2
	PIE      *bool    // nil: compiler default (PIE on Debian)
	Static   bool     // -static (non-PIE static executable)
	NoPLT    bool     // -fno-plt: hooks reached through the GOT
	Shared   bool     // build a shared library (-shared -fPIC)
	Strip    bool     // strip --strip-all after linking
	NoInstr  bool     // build without -finstrument-functions (baseline)
	Flags    []string // extra compiler flags
	LDFlags  []string // extra link flags, after the sources
	Name     string   // output file name; default derived from the spec
	Deps     []string // files the sources include (same base as Sources): not compiled, part of the cache key
	// Profile compiles with -pg: ProfileFentry (-pg -mfentry) or
	// ProfileMcount (-pg alone). Each source is compiled with -c and the
	// objects linked without -pg, which would link gcrt1.o and gmon's
	// profiling (gmon.out at exit): the production setup the fentry
	// provider is for. With NoInstr it is the only instrumentation.
	Profile string
}

// Fixture is a built program.
type Fixture struct {
	Path    string // the binary; a private copy the test may modify
	Command string // the build command, shell-quoted, for reproduction
}

// Spec.Profile values.
const (
	ProfileFentry = "fentry"
	ProfileMcount = "mcount"
)

// Bool returns a pointer to b, for Spec.PIE.
func Bool(b bool) *bool { return &b }

// String names the spec compactly for subtest names, e.g. "gcc-O2-nopie-static".
func (s Spec) String() string {
	parts := []string{s.compiler(), strings.TrimPrefix(s.opt(), "-")}
	if s.PIE != nil {
		if *s.PIE {
			parts = append(parts, "pie")
		} else {
			parts = append(parts, "nopie")
		}
	}
	for _, f := range []struct {
		on   bool
		name string
	}{{s.Static, "static"}, {s.NoPLT, "noplt"}, {s.Shared, "shared"}, {s.Strip, "stripped"}, {s.NoInstr, "noinstr"}, {s.Profile != "", s.Profile}} {
		if f.on {
			parts = append(parts, f.name)
		}
	}
	return strings.Join(parts, "-")
}

func (s Spec) compiler() string {
	if s.Compiler == "" {
		return "gcc"
	}
	return s.Compiler
}

func (s Spec) opt() string {
	if s.Opt == "" {
		return "-O2"
	}
	return s.Opt
}

// args returns the compiler arguments, output last.
func (s Spec) args(dir, out string) []string {
	args := s.common()
	for _, src := range s.Sources {
		args = append(args, filepath.Join(dir, src))
	}
	args = append(args, s.LDFlags...)
	return append(args, "-o", out)
}

// profileFlags are the -pg flags of s.Profile, given at compile time only.
func (s Spec) profileFlags() []string {
	switch s.Profile {
	case ProfileFentry:
		return []string{"-pg", "-mfentry"}
	case ProfileMcount:
		return []string{"-pg"}
	}
	return nil
}

// steps returns the commands that build s into out: one compile-and-link,
// or with Profile a compile of each source into obj/ then a link. Each
// step is the argument list after the compiler name.
func (s Spec) steps(dir, obj, out string) [][]string {
	if s.Profile == "" {
		return [][]string{s.args(dir, out)}
	}
	var steps [][]string
	link := s.common()
	for i, src := range s.Sources {
		o := filepath.Join(obj, fmt.Sprintf("%d.o", i))
		c := append(s.common(), s.profileFlags()...)
		steps = append(steps, append(c, "-c", filepath.Join(dir, src), "-o", o))
		link = append(link, o)
	}
	link = append(link, s.LDFlags...)
	return append(steps, append(link, "-o", out))
}

// common are the flags of every step; compile-only ones are harmless at link.
func (s Spec) common() []string {
	args := []string{s.opt(), "-g", "-pthread"}
	if !s.NoInstr {
		args = append(args, "-finstrument-functions")
	}
	if s.PIE != nil {
		if *s.PIE {
			args = append(args, "-fPIE", "-pie")
		} else {
			args = append(args, "-fno-pie", "-no-pie")
		}
	}
	if s.Static {
		args = append(args, "-static")
	}
	if s.NoPLT {
		args = append(args, "-fno-plt")
	}
	if s.Shared {
		args = append(args, "-shared", "-fPIC")
	}
	return append(args, s.Flags...)
}

var buildMu sync.Mutex // one compiler at a time per test binary: the machine has two cores

// Build compiles spec and returns a private copy of the result. A missing
// compiler ends the test (Unavailable); a failed build fails it.
func Build(t testing.TB, spec Spec) Fixture {
	t.Helper()
	RequireTool(t, spec.compiler())
	if spec.Strip {
		RequireTool(t, "strip")
	}
	dir := FixtureDir(t)
	name := spec.Name
	if name == "" {
		name = strings.TrimSuffix(spec.Sources[0], ".c") + "-" + spec.String()
		if spec.Shared {
			name = "lib" + name + ".so"
		}
	}
	var cmds []string
	for _, args := range spec.steps(dir, "OBJ", "OUT") {
		cmds = append(cmds, spec.compiler()+" "+strings.Join(args, " "))
	}
	cmdline := strings.Join(cmds, " && ")
	if spec.Strip {
		cmdline += " && strip --strip-all OUT"
	}
	h := sha256.New()
	fmt.Fprintln(h, cmdline, compilerVersion(t, spec.compiler()))
	for _, src := range append(append([]string(nil), spec.Sources...), spec.Deps...) {
		b, err := os.ReadFile(filepath.Join(dir, src))
		if err != nil {
			t.Fatalf("fixture source: %v", err)
		}
		h.Write(b)
	}
	key := hex.EncodeToString(h.Sum(nil))[:20]
	cached := filepath.Join(cacheDir(t), key, name)

	func() {
		buildMu.Lock()
		defer buildMu.Unlock() // build may t.Fatal, which unwinds through here
		if _, err := os.Stat(cached); err != nil {
			build(t, spec, dir, cached)
		}
	}()

	out := filepath.Join(t.TempDir(), name)
	copyFile(t, cached, out)
	return Fixture{Path: out, Command: strings.ReplaceAll(strings.ReplaceAll(cmdline, "OUT", name), "OBJ/", "")}
}

func build(t testing.TB, spec Spec, dir, cached string) {
	t.Helper()
	tmp, err := os.MkdirTemp(filepath.Dir(filepath.Dir(cached)), "build-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, filepath.Base(cached))
	for _, args := range spec.steps(dir, tmp, out) {
		run(t, spec.compiler(), args...)
	}
	if spec.Strip {
		run(t, "strip", "--strip-all", out)
	}
	if err := os.MkdirAll(filepath.Dir(cached), 0o755); err != nil {
		t.Fatal(err)
	}
	// Rename is atomic, so a concurrent test binary sees all of the file or none.
	if err := os.Rename(out, cached); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

var versions sync.Map

func compilerVersion(t testing.TB, cc string) string {
	if v, ok := versions.Load(cc); ok {
		return v.(string)
	}
	out, err := exec.Command(cc, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", cc, err)
	}
	versions.Store(cc, string(out))
	return string(out)
}

// CopyInto copies the executable file from into dir, under its own name,
// and returns the copy's path: a fixture placed where a test's other user
// or namespace can reach it.
func CopyInto(t testing.TB, from, dir string) string {
	t.Helper()
	to := filepath.Join(dir, filepath.Base(from))
	copyFile(t, from, to)
	return to
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

func cacheDir(t testing.TB) string {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	d := filepath.Join(base, "edgeprobe-fixtures")
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// Opts returns the optimisation levels a matrix walks: the given ones, and
// with EDGEPROBE_LONG every level from -O0 to -O3.
func Opts(short ...string) []string {
	if Long() {
		return []string{"-O0", "-O1", "-O2", "-O3"}
	}
	return short
}

// FixtureDir is testdata/fixtures at the repository root.
func FixtureDir(t testing.TB) string {
	t.Helper()
	return filepath.Join(RepoRoot(t), "testdata", "fixtures")
}

// RepoRoot is the directory holding go.mod.
func RepoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("testutil: cannot locate the source tree")
	}
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}

// Matrix is the compiler x optimisation x code-model matrix every scanner test
// walks: gcc and clang, PIE, non-PIE, -fno-plt, static, stripped, at -O0 and
// -O2, and with EDGEPROBE_LONG (`make test-long`) at -O1 and -O3 too.
func Matrix(sources ...string) []Spec {
	var specs []Spec
	for _, cc := range []string{"gcc", "clang"} {
		for _, opt := range Opts("-O0", "-O2") {
			specs = append(specs,
				Spec{Compiler: cc, Opt: opt, Sources: sources, PIE: Bool(true)},
				Spec{Compiler: cc, Opt: opt, Sources: sources, PIE: Bool(false)},
				Spec{Compiler: cc, Opt: opt, Sources: sources, PIE: Bool(true), NoPLT: true},
			)
		}
		specs = append(specs,
			Spec{Compiler: cc, Sources: sources, PIE: Bool(false), NoPLT: true},
			Spec{Compiler: cc, Sources: sources, Static: true, PIE: Bool(false)},
			Spec{Compiler: cc, Sources: sources, PIE: Bool(true), Strip: true},
			Spec{Compiler: cc, Sources: sources, PIE: Bool(true), NoPLT: true, Strip: true},
			Spec{Compiler: cc, Sources: sources, Static: true, PIE: Bool(false), Strip: true},
		)
	}
	return specs
}
