package shm

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestQuotasAtTheHook: with quotas on (K = 200) four threads call three hot
// functions millions of times while the "poller" (this test) is slow on
// purpose: it lets the threads make 200,000 iterations in every epoch before
// it looks. Every epoch, every hot function recorded exactly K calls (its
// quota word, counted at the hook across threads); over the run each
// recorded exactly K x epochs entries and as many timed exits, and every
// call over the quota recorded nothing: the threads' quota_skips are exactly
// the calls made minus the calls recorded (twice that for cyg, whose exit
// hooks run too). The cold function never reaches K in an epoch on
// average but is bounded all the same. The hooks sampled while quotas were
// on give the profiler a measured hit cost.
func TestQuotasAtTheHook(t *testing.T) {
	testutil.RequirePtrace(t) // opens the live region
	const k, epochs, threads, perEpoch = 200, 5, 4, 200000
	for _, b := range []struct {
		cc     string
		fentry bool
	}{{"gcc", false}, {"clang", false}, {"gcc", true}} {
		t.Run(fmt.Sprintf("%s-fentry%v", b.cc, b.fentry), func(t *testing.T) {
			lib := buildRuntime(t, b.cc)
			spec := testutil.Spec{Compiler: b.cc, Sources: []string{"quota.c"}, LDFlags: []string{"-pthread"},
				Name: fmt.Sprintf("quota-%s-fentry%v", b.cc, b.fentry)}
			if b.fentry {
				spec.NoInstr = true
				spec.Profile = testutil.ProfileFentry
			}
			bin := testutil.Build(t, spec).Path
			dir := t.TempDir()
			out, goFile := filepath.Join(dir, "out"), filepath.Join(dir, "go")
			p := testutil.Start(t, []string{"LD_PRELOAD=" + lib, "EDGEPROBE_OUTPUT=" + out}, bin, goFile, strconv.Itoa(threads))
			r, err := OpenPID(p.Pid)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if err := r.SetQuota(k); err != nil {
				t.Fatal(err)
			}
			if err := r.SetControl(CtlQuota, 0); err != nil {
				t.Fatal(err)
			}
			hot := map[string]uint64{}
			for _, name := range []string{"hot1", "hot2", "hot3"} {
				hot[name] = p.Symbol(bin, name)
			}
			progress := p.Symbol(bin, "progress")
			if err := os.WriteFile(goFile, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			for e := 0; e < epochs; e++ {
				if e > 0 {
					if _, err := r.NextQuotaEpoch(); err != nil {
						t.Fatal(err)
					}
				}
				epoch := r.QuotaEpoch()
				p.AwaitProgress(progress, perEpoch)
				for name, addr := range hot {
					ep, used, ok := r.QuotaUsed(addr)
					if !ok || ep != epoch || used != k {
						t.Errorf("epoch %d: %s recorded %d calls in epoch %d (known %v); want exactly %d", epoch, name, used, ep, ok, k)
					}
				}
			}
			stdout, _ := p.Finish()
			m := regexp.MustCompile(`calls hot1=(\d+) hot2=(\d+) hot3=(\d+) cold=(\d+)`).FindStringSubmatch(stdout)
			if m == nil {
				t.Fatalf("no calls line in %q", stdout)
			}
			calls := map[string]uint64{}
			for i, name := range []string{"hot1", "hot2", "hot3", "cold"} {
				calls[name], _ = strconv.ParseUint(m[i+1], 10, 64)
			}
			o := openOutput(t, out)
			funcs := byName(t, o, o.Maps())
			var recorded, made uint64
			for _, name := range []string{"hot1", "hot2", "hot3", "cold"} {
				f := funcs[name]
				recorded += f.Entries
				made += calls[name]
				if f.Exits != f.Entries || f.Samples != f.Entries || f.Unmatched != 0 || f.Orphans != 0 || f.Open != 0 {
					t.Errorf("%s: %d entries, %d exits, %d timed, %d unmatched, %d orphans, %d open; want every recorded call matched and timed",
						name, f.Entries, f.Exits, f.Samples, f.Unmatched, f.Orphans, f.Open)
				}
				if name == "cold" {
					if f.Entries == 0 || f.Entries > k*epochs {
						t.Errorf("cold: %d entries of %d calls; want 1..%d", f.Entries, calls[name], k*epochs)
					}
					continue
				}
				if f.Entries != k*epochs {
					t.Errorf("%s: %d entries of %d calls; want exactly %d (%d epochs of %d)", name, f.Entries, calls[name], k*epochs, epochs, k)
				}
			}
			var skips, samples uint64
			for _, th := range o.Threads() {
				skips += th.QuotaSkips
				samples += th.HookSamples
			}
			want := made - recorded
			if !b.fentry {
				want *= 2 // the exit hook of a skipped call runs and records nothing
			}
			if skips != want {
				t.Errorf("quota_skips %d; want %d (%d calls made, %d recorded)", skips, want, made, recorded)
			}
			ns, n := o.HookCost()
			if n == 0 || ns <= 0 {
				t.Errorf("hook cost %.1f ns from %d samples; want a measurement", ns, n)
			}
			t.Logf("%d calls made, %d recorded, %d hooks skipped; hook cost %.1f ns (%d samples)", made, recorded, skips, ns, n)
		})
	}
}
