package testutil

import (
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// RuntimeFlags are the flags the Makefile builds bin/libedgeprobe.so with
// (RUNTIME_CFLAGS there), so tests run the library users get.
var RuntimeFlags = []string{"-fno-plt", "-fvisibility=hidden", "-ftls-model=initial-exec", "-Wall", "-Wextra", "-Werror"}

// RuntimeFiles lists the runtime's files under runtime/ (names only, sorted):
// sources, every .c and .S file, as the Makefile and internal/bench build
// them; headers, every .h file, which the sources include.
func RuntimeFiles(t testing.TB) (sources, headers []string) {
	t.Helper()
	dir := filepath.Join(RepoRoot(t), "runtime")
	for _, pat := range []string{"*.c", "*.S", "*.h"} {
		m, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			t.Fatalf("listing the runtime's files: %v", err)
		}
		for _, p := range m {
			if strings.HasSuffix(p, ".h") {
				headers = append(headers, filepath.Base(p))
			} else {
				sources = append(sources, filepath.Base(p))
			}
		}
	}
	if len(sources) == 0 {
		t.Fatalf("no runtime sources under %s", dir)
	}
	sort.Strings(sources)
	sort.Strings(headers)
	return sources, headers
}

// Runtime builds the edgeprobe runtime (every .c and .S file under
// runtime/, see RuntimeFiles) with compiler cc and returns the library's
// path, a private copy like every fixture.
func Runtime(t testing.TB, cc string) string {
	t.Helper()
	return RuntimeWith(t, cc)
}

// RuntimeWith is Runtime built with extra compiler flags: a test build's
// macros (-DEP_TEST_PARK: runtime/edgeprobe_internal.h's test hook point),
// never the library users get.
func RuntimeWith(t testing.TB, cc string, flags ...string) string {
	t.Helper()
	srcs, hdrs := RuntimeFiles(t)
	rel := func(names []string) []string {
		var out []string
		for _, n := range names {
			out = append(out, "../../runtime/"+n) // fixture paths are relative to testdata/fixtures
		}
		return out
	}
	return Build(t, Spec{Compiler: cc, Opt: "-O2", Sources: rel(srcs), Deps: rel(hdrs), Shared: true,
		NoInstr: true, Flags: append(append([]string(nil), RuntimeFlags...), flags...), Name: "libedgeprobe.so"}).Path
}

// RuntimeArchive builds the runtime as a static archive (libedgeprobe.a,
// as the Makefile does) with compiler cc, for static programs, which link
// it with -Wl,--whole-archive. The archive is built anew in the test's
// temporary directory: one compilation per source, no cache needed.
func RuntimeArchive(t testing.TB, cc string) string {
	t.Helper()
	RequireTool(t, cc)
	RequireTool(t, "ar")
	dir := t.TempDir()
	src := filepath.Join(RepoRoot(t), "runtime")
	srcs, _ := RuntimeFiles(t)
	var objs []string
	for _, f := range srcs {
		// named after the whole file name: edgeprobe_fentry.c and .S both exist
		obj := filepath.Join(dir, f+".o")
		// EP_ARCHIVE, as the Makefile: the runtime's swapcontext calls
		// libc.a's by its internal name (a static program has no dlsym)
		args := append([]string{"-O2", "-g", "-fPIC", "-pthread", "-DEP_ARCHIVE"}, RuntimeFlags...)
		run(t, cc, append(args, "-c", filepath.Join(src, f), "-o", obj)...)
		objs = append(objs, obj)
	}
	lib := filepath.Join(dir, "libedgeprobe.a")
	run(t, "ar", append([]string{"rcs", lib}, objs...)...)
	return lib
}
