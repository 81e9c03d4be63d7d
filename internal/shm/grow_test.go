package shm

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/cgen"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestFunctionTableGrows: a program with 20,000 instrumented functions
// (under make test-long also 100,000, and 20,000 built -pg -mfentry), every
// probe on (not coldpatched), four
// threads calling each function 1, 2 or 3 times per pass: every function is
// recorded with exactly its calls, nothing is counted as function_table_full,
// the table grew past its first segment, and the live region and the output
// file agree. With a 64-slot first segment the table grows through ten
// segments while the threads race to add them; with a cap, what does not fit
// is counted as dropped, call for call (D35).
func TestFunctionTableGrows(t *testing.T) {
	libs := map[string]string{"gcc": buildRuntime(t, "gcc"), "clang": buildRuntime(t, "clang")}
	const passes, threads = 2, 4
	type build struct {
		n      int
		fentry bool // -pg -mfentry instead of -finstrument-functions
	}
	builds := []build{{20000, false}}
	if testutil.Long() {
		builds = append(builds, build{100000, false}, build{20000, true})
	}
	for _, b := range builds {
		n := b.n
		name := fmt.Sprintf("counted%d", n)
		spec := testutil.Spec{Sources: []string{testutil.Generated(t, name, cgen.Counted(n))}, Opt: "-O0", Name: name}
		if b.fentry {
			spec.NoInstr, spec.Profile, spec.Name = true, testutil.ProfileFentry, name+"-fentry"
		}
		bin := testutil.Build(t, spec).Path
		want := map[string]ee{}
		var total uint64
		for i := 0; i < n; i++ {
			c := passes * threads * cgen.CountedCalls(i)
			want[fmt.Sprintf("f%d", i)] = ee{c, c}
			total += c
		}
		for _, tc := range []struct {
			name, runtime string // runtime: the compiler that built the runtime
			env           []string
			capSlots      uint64 // 0: no cap reached
		}{
			{"default", "gcc", nil, 0},
			{"first64", "gcc", []string{"EDGEPROBE_FIRST_FUNCS=64"}, 0},
			{"first64-clang-runtime", "clang", []string{"EDGEPROBE_FIRST_FUNCS=64"}, 0},
			{"capped", "gcc", []string{"EDGEPROBE_FIRST_FUNCS=1024", "EDGEPROBE_MAX_FUNCS=8192"}, 8192},
		} {
			t.Run(fmt.Sprintf("%s/%s", spec.Name, tc.name), func(t *testing.T) {
				out := filepath.Join(t.TempDir(), "out")
				env := append([]string{"LD_PRELOAD=" + libs[tc.runtime], "EDGEPROBE_OUTPUT=" + out}, tc.env...)
				p := testutil.Start(t, env, bin, fmt.Sprint(passes), fmt.Sprint(threads))
				live, err := OpenPID(p.Pid)
				if err != nil {
					t.Fatal(err)
				}
				maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", p.Pid))
				if err != nil {
					t.Fatal(err)
				}
				rss, size := regionRss(t, p.Pid)
				t.Logf("%d functions: table %d slots in %d segments; region %d KiB resident of %d KiB",
					n, live.FuncSlots(), live.Header().FuncSegs, rss, size)
				checkGrown(t, live, maps, n, want, total, tc.capSlots, b.fentry)
				live.Close()
				p.Finish()
				r := openOutput(t, out)
				checkGrown(t, r, r.Maps(), n, want, total, tc.capSlots, b.fentry)
				if st, err := os.Stat(out); err == nil && tc.capSlots == 0 {
					// Only the segments in use are written: the file is about
					// the size of what was recorded, not of the cap.
					t.Logf("output file %d KiB (max_funcs %d)", st.Size()>>10, r.Header().MaxFuncs)
					if limit := int64(r.FuncSlots())*(funcSize+8) + 64<<20; st.Size() > limit {
						t.Errorf("output file %d bytes for %d slots in use", st.Size(), r.FuncSlots())
					}
				}
			})
		}
	}
}

func checkGrown(t *testing.T, r *Region, maps []byte, n int, want map[string]ee, total, capSlots uint64, fentry bool) {
	t.Helper()
	c := r.Counters()
	h := r.Header()
	// The reader's probe sequence is the runtime's: every key is found by
	// lookup (NewGeneration's path) at the slot the runtime claimed for it,
	// in whichever segment, and a key never recorded is not found.
	found := 0
	d := r.data(r.keysRange())
	for i := uint64(0); i < r.FuncSlots(); i++ {
		key := *r.keyAt(i)
		if key == 0 {
			continue
		}
		found++
		if e := r.lookupIn(d, key); e != r.funcAt(i) {
			t.Fatalf("key %#x claimed at slot %d: lookup finds %p, want %p", key, i, e, r.funcAt(i))
		}
	}
	if uint64(found) != c.FuncsUsed {
		t.Errorf("%d keys in the table, funcs_used %d", found, c.FuncsUsed)
	}
	if e := r.lookup(1); e != nil {
		t.Errorf("lookup of a key never recorded found %p", e)
	}
	if capSlots != 0 {
		// The cap holds: the table stops at it, and every call of a function
		// it had no room for is counted as dropped, never lost silently.
		if r.FuncSlots() != capSlots || c.FuncsUsed == 0 || c.FuncsUsed >= uint64(n) || c.FuncDropEnters == 0 {
			t.Fatalf("capped at %d slots: %d slots in use, funcs_used %d, drops %d", capSlots, r.FuncSlots(), c.FuncsUsed, c.FuncDropEnters)
		}
		var entries, exits uint64
		got := byName(t, r, maps)
		for name, f := range got {
			w, ok := want[name]
			if !ok || f.Entries != w.entries || f.Exits != w.exits {
				t.Errorf("%s: %d/%d, want %v", name, f.Entries, f.Exits, w)
			}
			entries += f.Entries
			exits += f.Exits
		}
		// fentry: a call whose entry found no slot is not hijacked, so its
		// return never reaches the runtime (no exit to drop).
		wantExits := total
		if fentry {
			wantExits = total - c.FuncDropEnters
		}
		if uint64(len(got)) != c.FuncsUsed || entries+c.FuncDropEnters != total || exits+c.FuncDropExits != wantExits {
			t.Errorf("%d functions (funcs_used %d): recorded+dropped enters %d+%d, exits %d+%d, want %d, %d",
				len(got), c.FuncsUsed, entries, c.FuncDropEnters, exits, c.FuncDropExits, total, wantExits)
		}
		return
	}
	if c.FuncDropEnters+c.FuncDropExits != 0 || c.FuncsUsed != uint64(n) {
		t.Errorf("function_table_full %d+%d, funcs_used %d: want 0 and %d", c.FuncDropEnters, c.FuncDropExits, c.FuncsUsed, n)
	}
	if h.FuncSegs < 2 || r.FuncSlots() < uint64(n) {
		t.Errorf("table of %d slots in %d segments for %d functions: it did not grow", r.FuncSlots(), h.FuncSegs, n)
	}
	if c.Orphans+c.Unmatched+c.ThreadDropHits+c.PreinitDrops+c.LateDrops+c.StackOverflows+c.ReentrantDrops != 0 {
		t.Errorf("losses: %+v", c)
	}
	got := byName(t, r, maps)
	checkCounts(t, got, want)
	for name, f := range got {
		if !f.Balanced() || f.Samples != f.Exits {
			t.Errorf("%s: not balanced or not every exit timed: %+v", name, f)
			break
		}
	}
}

// TestFunctionTableAddressLimit: under an address-space limit (RLIMIT_AS,
// 1 GiB) the table's full cap cannot be mapped; the runtime halves the cap
// until the region fits instead of recording nothing, and the 20,000
// functions are still every one counted exactly.
func TestFunctionTableAddressLimit(t *testing.T) {
	testutil.RequireTool(t, "prlimit")
	lib := buildRuntime(t, "gcc")
	const n, passes, threads = 20000, 1, 2
	name := fmt.Sprintf("counted%d", n)
	bin := testutil.Build(t, testutil.Spec{Sources: []string{testutil.Generated(t, name, cgen.Counted(n))}, Opt: "-O0", Name: name}).Path
	dir := t.TempDir()
	stop, out := filepath.Join(dir, "stop"), filepath.Join(dir, "out")
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// prlimit sets the limit and execs the program (the preloaded runtime
	// in prlimit itself is gone with the exec).
	got := mustRun(t, lib, "prlimit", []string{"EDGEPROBE_OUTPUT=" + out}, "--as=1073741824", bin, stop, fmt.Sprint(passes), fmt.Sprint(threads))
	if len(got) < 6 || got[:6] != "ready " {
		t.Fatalf("output %q", got)
	}
	r := openOutput(t, out)
	want := map[string]ee{}
	var total uint64
	for i := 0; i < n; i++ {
		c := passes * threads * cgen.CountedCalls(i)
		want[fmt.Sprintf("f%d", i)] = ee{c, c}
		total += c
	}
	checkGrown(t, r, r.Maps(), n, want, total, 0, false)
}
