package hotpatch

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestZombieTarget: a probed process that has exited and that its parent
// has not reaped (a zombie). Every command on it must say in one line that
// it has exited, with exit status 4 (gone), as for a pid that does not
// exist. Before, root's enable and repair said `attach to thread N (needs
// root or CAP_SYS_PTRACE): permission denied` (exit 1: the attach's EPERM
// read as a permission problem) and list `maps no object with hook sites`.
func TestZombieTarget(t *testing.T) {
	testutil.RequirePtrace(t)
	fx := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"zombie.c"}})
	p := testutil.Start(t, nil, fx.Path)
	l := p.Line()
	z := strings.TrimPrefix(l, "zombie ")
	if z == l || z == "" {
		t.Fatalf("fixture: %q", l)
	}
	zpid, err := strconv.Atoi(z)
	if err != nil {
		t.Fatalf("fixture: %q", l)
	}
	for deadline := time.Now().Add(time.Minute); !procfs.Gone(zpid, 0); time.Sleep(time.Millisecond) { // polling, not synchronisation
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not exit in a minute", zpid)
		}
	}
	for _, args := range [][]string{
		{"--pid", z, "--enable", "work"},
		{"--pid", z, "--protocol", "int3", "--enable", "work"},
		{"repair", "--pid", z},
		{"list", "--pid", z},
		{"stats", "--pid", z},
	} {
		r := command(t, "hotpatch", args...)
		if r.Code != 4 || r.Stdout != "" || strings.Count(r.Stderr, "\n") != 1 || !strings.Contains(r.Stderr, "exited") {
			t.Errorf("hotpatch %s on a zombie: exit %d, stdout %q, stderr %q; want exit 4, one line saying it exited",
				strings.Join(args, " "), r.Code, r.Stdout, r.Stderr)
		}
	}
	p.Finish()
}
