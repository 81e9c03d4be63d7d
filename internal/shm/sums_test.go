package shm

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestSumsWrap (D92): a program writes its own counters in its region
// (liar.c; a program lying about itself, or a corruption) so that the sums
// hotpatch forms pass 2^64: a function's shared count plus its thread
// caches' counts, its histogram's buckets, the threads' drop counters.
// Before D92 they wrapped silently: `stats` printed `CALLS 199` for
// 2^64+199 and called the function balanced. Now stats (text and JSON), top
// and profile end with one line naming the function (or the counter) and
// exit 1;
// with the true values written back, stats reports the program's 200 calls.
func TestSumsWrap(t *testing.T) {
	for _, cc := range []string{"gcc", "clang"} {
		t.Run(cc, func(t *testing.T) {
			lib := buildRuntime(t, cc)
			bin := testutil.Build(t, testutil.Spec{Compiler: cc, Opt: "-O2", Sources: []string{"liar.c"}}).Path
			pokes := filepath.Join(t.TempDir(), "pokes")
			p := testutil.Start(t, []string{"LD_PRELOAD=" + lib}, bin, pokes)
			r, err := OpenPID(p.Pid)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			work := p.Symbol(bin, "work")
			off := func(ptr *uint64) uint64 {
				return uint64(uintptr(unsafe.Pointer(ptr)) - uintptr(unsafe.Pointer(&r.mem[0])))
			}
			gidx := -1
			for i := uint64(0); i < r.FuncSlots(); i++ {
				if *r.keyAt(i) == work {
					gidx = int(i)
				}
			}
			if gidx < 0 {
				t.Fatalf("work (%#x) not in the function table", work)
			}
			e := r.funcAt(uint64(gidx))
			var cached []*localEntry // work's thread-cache entries, one per thread
			var slots []*threadSlot
			for s := uint64(0); s < uint64(r.hdr.MaxThreads); s++ {
				if !r.slotUsed(r.data(r.threadRange()), s) {
					continue
				}
				slots = append(slots, r.slotAt(s))
				for i := uint64(0); i < uint64(r.hdr.LocalFuncs); i++ {
					if l := r.localAt(s, i); l.Addr != 0 && l.Gidx == uint32(gidx) {
						cached = append(cached, l)
					}
				}
			}
			var cachedEntries uint64
			for _, l := range cached {
				cachedEntries += l.Entries
			}
			if cachedEntries == 0 || len(slots) < 2 {
				t.Fatalf("want work's calls in its threads' caches and two thread slots: %d cached entries, %d slots", cachedEntries, len(slots))
			}
			// poke writes the words through the program and waits for it.
			poke := func(words map[*uint64]uint64) {
				t.Helper()
				var b strings.Builder
				for ptr, v := range words {
					fmt.Fprintf(&b, "%d %d\n", off(ptr), v)
				}
				if err := os.WriteFile(pokes, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := syscall.Kill(p.Pid, syscall.SIGUSR1); err != nil {
					t.Fatal(err)
				}
				if got, want := p.Line(), fmt.Sprintf("poked %d", len(words)); got != want {
					t.Fatalf("program said %q, want %q", got, want)
				}
			}
			hp := testutil.Command(t, "hotpatch")
			run := func(args ...string) (string, string, error) {
				c := exec.Command(hp, args...)
				var so, se strings.Builder
				c.Stdout, c.Stderr = &so, &se
				err := testutil.RunBound(c)
				return so.String(), se.String(), err
			}
			pid := fmt.Sprint(p.Pid)
			const max = math.MaxUint64
			hist := &e.Hist[0]
			for b := range e.Hist {
				if e.Hist[b] != 0 {
					hist = &e.Hist[b]
				}
			}
			other := &e.Hist[0]
			if other == hist {
				other = &e.Hist[1]
			}
			for _, c := range []struct {
				name  string
				words map[*uint64]uint64
				want  []string // in the one line
				top   bool
			}{
				{"entries", map[*uint64]uint64{&e.Entries: max}, []string{"function work ", ": entries"}, true},
				{"exits-total", map[*uint64]uint64{&e.Exits: max, &e.SumNs: max}, []string{"function work ", "exits, total_ns"}, false},
				{"samples", map[*uint64]uint64{hist: max, other: max}, []string{"function work ", ": samples"}, true},
				{"thread-counters", map[*uint64]uint64{&slots[0].Orphans: max, &slots[1].Orphans: max}, []string{"orphan_exits"}, false},
			} {
				t.Run(c.name, func(t *testing.T) {
					orig := map[*uint64]uint64{}
					for ptr := range c.words {
						orig[ptr] = *ptr
					}
					poke(c.words)
					args := [][]string{{"stats", "--pid", pid}, {"stats", "--json", "--pid", pid}}
					if c.top {
						args = append(args, []string{"top", "--pid", pid, "--count", "1", "--interval", "10ms"},
							[]string{"profile", "--pid", pid, "--duration", "100ms", "-o", filepath.Join(t.TempDir(), "p.json")})
					}
					for _, a := range args {
						so, se, err := run(a...)
						ee, _ := err.(*exec.ExitError)
						if ee == nil || ee.ExitCode() != 1 || so != "" || strings.Count(se, "\n") != 1 || !strings.Contains(se, "counters wrap") {
							t.Errorf("%s: %v, stdout %.300q, stderr %q; want exit 1, nothing on stdout, one line saying the counters wrap", strings.Join(a, " "), err, so, se)
							continue
						}
						for _, w := range c.want {
							if !strings.Contains(se, w) {
								t.Errorf("%s: stderr %q does not say %q", strings.Join(a, " "), se, w)
							}
						}
					}
					poke(orig)
					so, se, err := run("stats", "--pid", pid)
					if err != nil || !strings.Contains(so, "work") {
						t.Fatalf("stats with the true counts written back: %v, stderr %q, stdout %q", err, se, so)
					}
				})
			}
			for _, f := range r.Functions() {
				if f.Addr == work && (f.Entries != 200 || f.Exits != 200 || !f.Balanced() || len(f.Overflow) != 0) {
					t.Errorf("work after the counts were written back: %+v; want 200 calls, balanced", f)
				}
			}
		})
	}
}
