package elfscan

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// mayHaveSites runs MayHaveSites on a file and checks it against a full
// Scan: never false where Scan lists a probe.
func mayHaveSites(t *testing.T, path string) bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	may, err := MayHaveSites(data, path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	l, _, err := Scan(path, Options{})
	if err != nil && !errors.Is(err, ErrNoHookSites) {
		t.Fatalf("%s: scan: %v", path, err)
	}
	if !may && l != nil && len(l.Probes) > 0 {
		t.Fatalf("%s: MayHaveSites says no, Scan lists %d probes", path, len(l.Probes))
	}
	return may
}

// TestMayHaveSitesDefinesOnly: objects that define the hooks and never
// call them are recognised without a scan: glibc (the system's, as every
// process maps it) and a library of our own counting hooks. Those that
// call them are not: the instrumented fixtures, their cold copies (sites in
// the flip-inert form), and static programs, which define the hooks they
// call (glibc's, or the edgeprobe runtime linked whole).
func TestMayHaveSitesDefinesOnly(t *testing.T) {
	hooksLib := testutil.Build(t, testutil.Spec{Sources: []string{"hooks.c"}, Shared: true, NoInstr: true})
	runtimeLib := testutil.Runtime(t, "gcc")
	libc := mappedLibc(t)
	for _, p := range []string{libc, hooksLib.Path, runtimeLib} {
		if mayHaveSites(t, p) {
			t.Errorf("%s defines the hooks and calls none, yet MayHaveSites says it may have sites", p)
		}
	}
	archive := testutil.RuntimeArchive(t, "gcc")
	cases := map[string]testutil.Spec{
		"pie":                {Sources: []string{"basic.c"}},
		"noplt":              {Sources: []string{"basic.c"}, NoPLT: true},
		"own-hooks":          {Sources: []string{"basic.c", "hooks.c"}, PIE: testutil.Bool(true)},
		"static-glibc-hooks": {Sources: []string{"basic.c"}, Static: true, PIE: testutil.Bool(false)},
		"static-runtime":     {Sources: []string{"mt.c"}, Static: true, PIE: testutil.Bool(false), LDFlags: []string{"-Wl,--whole-archive", archive, "-Wl,--no-whole-archive"}},
		"fentry":             {Sources: []string{"basic.c"}, NoInstr: true, Profile: testutil.ProfileFentry},
		"clang-static-glibc": {Compiler: "clang", Sources: []string{"basic.c"}, Static: true, PIE: testutil.Bool(false)},
	}
	for name, spec := range cases {
		t.Run(name, func(t *testing.T) {
			fx := testutil.Build(t, spec)
			if !mayHaveSites(t, fx.Path) {
				t.Fatalf("MayHaveSites says no\n%s", fx.Command)
			}
			if name == "static-runtime" {
				// The runtime's hooks are distinct functions: Scan lists the sites.
				l, _ := mustScan(t, fx, Options{})
				if len(l.Probes) == 0 {
					t.Fatalf("no probes in a static program linking the runtime\n%s", fx.Command)
				}
			}
			l, _, err := Scan(fx.Path, Options{})
			if err != nil || len(l.Probes) == 0 {
				return // glibc's static hooks: sites reported, not listed
			}
			cold := coldCopy(t, fx.Path, l)
			if !mayHaveSites(t, cold) {
				t.Errorf("MayHaveSites says no for the cold copy\n%s", fx.Command)
			}
		})
	}
}

// TestMayHaveSitesUninstrumented: builds without instrumentation, and the
// other libraries every process maps, have no sites to find.
func TestMayHaveSitesUninstrumented(t *testing.T) {
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}, NoInstr: true})
	paths := []string{fx.Path}
	if m, _ := filepath.Glob("/lib64/ld-linux-x86-64.so.2"); len(m) > 0 {
		paths = append(paths, m[0])
	}
	for _, p := range paths {
		if mayHaveSites(t, p) {
			t.Errorf("%s: MayHaveSites says it may have sites", p)
		}
	}
}

// TestMayHaveSitesMatrix: over the matrix, whatever Scan lists,
// MayHaveSites allows (mayHaveSites checks it).
func TestMayHaveSitesMatrix(t *testing.T) {
	for _, spec := range testutil.Matrix("basic.c") {
		t.Run(spec.String(), func(t *testing.T) {
			fx := testutil.Build(t, spec)
			l, _, _ := Scan(fx.Path, Options{Placeholder: probelist.PlaceholderFlip})
			if may := mayHaveSites(t, fx.Path); !may && l != nil && len(l.Probes) > 0 {
				t.Fatal("unreachable: mayHaveSites checks this")
			}
		})
	}
}

// mappedLibc is the C library this test process's children map.
func mappedLibc(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6"} {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return r
		}
	}
	testutil.Unavailable(t, "no libc.so.6 in the usual places")
	return ""
}

// BenchmarkMayHaveSitesLibc: what skipping glibc costs, against a full scan
// of it (BenchmarkScanLibc).
func BenchmarkMayHaveSitesLibc(b *testing.B) {
	data, err := os.ReadFile("/lib/x86_64-linux-gnu/libc.so.6")
	if err != nil {
		b.Skip(err)
	}
	for i := 0; i < b.N; i++ {
		if may, err := MayHaveSites(data, "libc.so.6"); err != nil || may {
			b.Fatal(may, err)
		}
	}
}

func BenchmarkScanLibc(b *testing.B) {
	for i := 0; i < b.N; i++ {
		if _, _, err := Scan("/lib/x86_64-linux-gnu/libc.so.6", Options{}); err != nil && !errors.Is(err, ErrNoHookSites) {
			b.Fatal(err)
		}
	}
}
