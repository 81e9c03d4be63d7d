package testutil

import "testing"

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
