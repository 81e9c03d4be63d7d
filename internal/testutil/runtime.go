package testutil

import (
	"path/filepath"
	"strings"
	"testing"
)

// RuntimeFlags are the flags the Makefile builds bin/libedgeprobe.so with
// (RUNTIME_CFLAGS there), so tests run the library users get.
var RuntimeFlags = []string{"-fno-plt", "-fvisibility=hidden", "-ftls-model=initial-exec", "-Wall", "-Wextra", "-Werror"}

// Runtime builds the edgeprobe runtime (runtime/edgeprobe.c and the fentry
// entry/trampoline in runtime/edgeprobe_fentry.S) with compiler cc and
// returns the library's path, a private copy like every fixture.
func Runtime(t testing.TB, cc string) string {
	t.Helper()
	return Build(t, Spec{Compiler: cc, Opt: "-O2", Sources: []string{"../../runtime/edgeprobe.c", "../../runtime/edgeprobe_fentry.S"}, Shared: true,
		NoInstr: true, Flags: RuntimeFlags, Name: "libedgeprobe.so"}).Path
}

// RuntimeArchive builds the runtime as a static archive (libedgeprobe.a,
// as the Makefile does) with compiler cc, for static programs, which link
// it with -Wl,--whole-archive. The archive is built anew in the test's
// temporary directory: two compilations, no cache needed.
func RuntimeArchive(t testing.TB, cc string) string {
	t.Helper()
	RequireTool(t, cc)
	RequireTool(t, "ar")
	dir := t.TempDir()
	src := filepath.Join(RepoRoot(t), "runtime")
	var objs []string
	for _, f := range []string{"edgeprobe.c", "edgeprobe_fentry.S"} {
		obj := filepath.Join(dir, strings.TrimSuffix(strings.TrimSuffix(f, ".c"), ".S")+".o")
		args := append([]string{"-O2", "-g", "-fPIC", "-pthread"}, RuntimeFlags...)
		run(t, cc, append(args, "-c", filepath.Join(src, f), "-o", obj)...)
		objs = append(objs, obj)
	}
	lib := filepath.Join(dir, "libedgeprobe.a")
	run(t, "ar", append([]string{"rcs", lib}, objs...)...)
	return lib
}
