package shm

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestQuotaLongjmpIdentity (review, hostile): longjmp and siglongjmp (out of
// a signal handler raised four probed frames down) over frames that quotas
// (D31) recorded or skipped. Per function, exactly min(calls, K) calls are
// recorded (one epoch) and each is balanced: entries = exits + unmatched,
// no orphans, nothing open after exit; the skipped frames jumped over are
// counted nowhere.
func TestQuotaLongjmpIdentity(t *testing.T) {
	testutil.RequirePtrace(t) // opens the live region
	const k, n = 50, 100
	for _, b := range []struct{ cc, opt string }{{"gcc", "-O0"}, {"gcc", "-O1"}, {"clang", "-O2"}} {
		t.Run(b.cc+b.opt, func(t *testing.T) {
			lib := buildRuntime(t, b.cc)
			bin := testutil.Build(t, testutil.Spec{Compiler: b.cc, Opt: b.opt, Sources: []string{"qjmp.c"}}).Path
			dir := t.TempDir()
			out, goFile := filepath.Join(dir, "out"), filepath.Join(dir, "go")
			p := testutil.Start(t, []string{"LD_PRELOAD=" + lib, "EDGEPROBE_OUTPUT=" + out}, bin, goFile, strconv.Itoa(n))
			r, err := OpenPID(p.Pid)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.SetQuota(k); err != nil {
				t.Fatal(err)
			}
			if err := r.SetControl(CtlQuota, 0); err != nil {
				t.Fatal(err)
			}
			r.Close()
			if err := os.WriteFile(goFile, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			stdout, _ := p.Finish()
			m := regexp.MustCompile(`calls jmp_outer=(\d+) sig_outer=(\d+) deep=(\d+) hwork=(\d+)`).FindStringSubmatch(stdout)
			if m == nil {
				t.Fatalf("no calls line in %q", stdout)
			}
			o := openOutput(t, out)
			funcs := byName(t, o, o.Maps())
			for i, name := range []string{"jmp_outer", "sig_outer", "deep", "hwork"} {
				calls, _ := strconv.ParseUint(m[i+1], 10, 64)
				f, ok := funcs[name]
				if !ok {
					t.Errorf("%s not recorded", name)
					continue
				}
				want := min(calls, uint64(k))
				if f.Entries != want || f.Entries != f.Exits+f.Unmatched || f.Orphans != 0 || f.Open != 0 {
					t.Errorf("%s: %d calls: %d entries (want %d), %d exits, %d unmatched, %d orphans, %d open; want entries = exits + unmatched",
						name, calls, f.Entries, want, f.Exits, f.Unmatched, f.Orphans, f.Open)
				}
				t.Logf("%s: %d calls, %d entries, %d exits, %d unmatched", name, calls, f.Entries, f.Exits, f.Unmatched)
			}
		})
	}
}
