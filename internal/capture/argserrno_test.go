package capture

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// The string copy of --args runs in the probed thread at
// the function's entry; a char * that points at unreadable memory makes its
// system call fail, and the hook must not leave that failure in the
// program's errno (t_str never touches errno; the program checks it after
// every call).
func TestArgsStringKeepsErrno(t *testing.T) {
	testutil.RequirePtrace(t)
	for _, cc := range []string{"gcc", "clang"} {
		t.Run(cc, func(t *testing.T) {
			lib := testutil.Runtime(t, "gcc")
			fx := testutil.Build(t, testutil.Spec{Compiler: cc, Opt: "-O2", Sources: []string{"argserrno.c"}, Profile: testutil.ProfileFentry, NoInstr: true})
			if r := testutil.Run(t, "coldpatch", fx.Path); r.Code != 0 {
				t.Fatal(r.Stderr)
			}
			p := testutil.Start(t, []string{"LD_PRELOAD=" + lib}, fx.Path)
			out := filepath.Join(t.TempDir(), "t.txt")
			run(t, "trace", "--pid", fmt.Sprint(p.Pid), "--enable", "t_str", "--args", "t_str",
				"--duration", "60s", "--max-calls", "300", "--format", "text", "-o", out)
			stdout, _ := p.Finish()
			m := regexp.MustCompile(`done calls=(\d+) changed=(\d+)`).FindStringSubmatch(stdout)
			if m == nil {
				t.Fatalf("program output %q", stdout)
			}
			if m[2] != "0" {
				t.Errorf("the program saw errno change in %s of %s calls of t_str while their char * arguments were copied", m[2], m[1])
			}
			raw, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			text := string(raw)
			if !strings.Contains(text, `"xxxxxxxx`) || !strings.Contains(text, `"plain"`) {
				t.Errorf("trace lacks the string at the mapping's end or the plain one:\n%.2000s", text)
			}
		})
	}
}
