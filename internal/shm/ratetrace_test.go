package shm

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestRateTraceExact (D55): a --rate trace holds exactly the calls the
// quotas let record in its epochs, under the hostile timings of a capture's
// start and end. Eight threads (four times the cores this suite assumes,
// so hooks are preempted mid-way) call three hot functions without pause;
// forty short traces run back to back, each started while the epoch before
// it is still filling (so hooks with and without the events on are taking
// slots of it) and ended right after its last epoch began (so hooks are
// taking slots of that one while the end seals it). Each trace's enter
// events of a function must number K for each full epoch plus what the seal
// found recorded in the last one: not one more (a slot of the epoch before
// the start, traced by a hook that read the events on) and not one less (a
// slot taken by a hook that read the control word before the start, or
// whose event came after the last drain).
func TestRateTraceExact(t *testing.T) {
	testutil.RequirePtrace(t) // opens the live region
	const k, traces, threads = 3, 40, 8
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
			goFile := dir + "/go"
			p := testutil.Start(t, []string{"LD_PRELOAD=" + lib, "EDGEPROBE_OUTPUT=" + dir + "/out", "EDGEPROBE_RING_EVENTS=4096"},
				bin, goFile, strconv.Itoa(threads))
			r, err := OpenPID(p.Pid)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			hot := map[uint64]string{}
			for _, name := range []string{"hot1", "hot2", "hot3"} {
				hot[p.Symbol(bin, name)] = name
			}
			if err := r.SetQuota(k); err != nil {
				t.Fatal(err)
			}
			if err := r.SetControl(CtlQuota, 0); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(goFile, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			p.AwaitProgress(p.Symbol(bin, "progress"), 100000)
			// full waits until every hot function recorded its K calls of
			// the current epoch (microseconds for eight spinning threads).
			full := func() {
				deadline := time.Now().Add(time.Minute)
				for addr, name := range hot {
					for {
						e, used, ok := r.QuotaUsed(addr)
						if ok && e == r.QuotaEpoch() && used == k {
							break
						}
						if time.Now().After(deadline) {
							t.Fatalf("%s never recorded its %d calls of an epoch", name, k)
						}
						time.Sleep(10 * time.Microsecond)
					}
				}
			}
			for i := 0; i < traces; i++ {
				epochs := 1 + i%3
				if _, err := r.NextQuotaEpoch(); err != nil { // the epoch before: filling now
					t.Fatal(err)
				}
				_, gen, err := r.StartQuotaTrace(CtlTrace)
				if err != nil {
					t.Fatal(err)
				}
				for e := 1; e < epochs; e++ {
					full()
					if _, err := r.NextQuotaEpoch(); err != nil {
						t.Fatal(err)
					}
				}
				last, busy, err := r.EndQuotaTrace(10 * time.Second)
				if err != nil || busy != 0 {
					t.Fatalf("end: %d threads in flight (%v)", busy, err)
				}
				if err := r.SetControl(0, CtlTrace); err != nil {
					t.Fatal(err)
				}
				got := map[uint64]int{}
				for _, th := range r.Threads() {
					if _, err := r.Consume(th.Index, func(e Event) {
						if e.Kind == EvEnter {
							got[e.Addr&^KeyBare]++
							// D79: a call of the trace's epochs is stamped
							// with the trace's generation or a later one,
							// whatever control word its hook read first
							if !e.Stamped || int32(e.Gen-gen) < 0 {
								t.Errorf("trace %d: an enter event of the trace's epochs stamped %d (stamped %v); the trace's generation is %d", i, e.Gen, e.Stamped, gen)
							}
						}
					}); err != nil {
						t.Fatal(err)
					}
					if d := r.RingDropped(th.Index); d != 0 {
						t.Fatalf("thread slot %d dropped %d events", th.Index, d)
					}
				}
				if err := r.ClearQuotaTrace(); err != nil {
					t.Fatal(err)
				}
				for addr, name := range hot {
					if want := k*(epochs-1) + int(last[addr]); got[addr] != want {
						t.Errorf("trace %d (%d epochs): %s has %d enter events; want %d (%d full epochs of %d, %d in the last)",
							i, epochs, name, got[addr], want, epochs-1, k, last[addr])
					}
				}
			}
		})
	}
}
