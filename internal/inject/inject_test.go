package inject_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/inject"
	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// The tracer must not be the target's parent (docs/decisions.md, D7: the
// parent's wait4 would take the tracer's ptrace stops), so Load runs in a
// child: this test binary again, as the helper TestMain starts.
const helperEnv = "EDGEPROBE_INJECT_HELPER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(helperEnv); spec != "" {
		os.Exit(helper(spec))
	}
	os.Exit(m.Run())
}

// helper: "PID RUNTIME [direct]" (RUNTIME "-" routes only); prints the
// Result as JSON.
func helper(spec string) int {
	f := strings.Fields(spec)
	pid, _ := strconv.Atoi(f[0])
	p, err := inject.Inspect(pid)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var opts inject.Options
	opts.Direct = len(f) > 2 && f[2] == "direct"
	if f[1] != "-" {
		if opts.Runtime, err = inject.ReadRuntime(f[1], os.Getuid()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	res, err := inject.Load(context.Background(), p, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	json.NewEncoder(os.Stdout).Encode(res)
	return 0
}

// load runs Load on pid in a helper process.
func load(t testing.TB, pid int, runtime string, extra ...string) inject.Result {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d %s %s", helperEnv, pid, runtime, strings.Join(extra, " ")))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := testutil.OutputBound(cmd)
	if err != nil {
		t.Fatalf("load into pid %d: %v: %s", pid, err, stderr.String())
	}
	var res inject.Result
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("load result %q: %v", out, err)
	}
	return res
}

// TestLoaderBytes: the loader code equals what testdata/loader.S assembles to.
func TestLoaderBytes(t *testing.T) {
	testutil.RequireTool(t, "as")
	testutil.RequireTool(t, "objcopy")
	dir := t.TempDir()
	obj, bin := filepath.Join(dir, "loader.o"), filepath.Join(dir, "loader.bin")
	for _, c := range [][]string{{"as", "testdata/loader.S", "-o", obj}, {"objcopy", "-O", "binary", "-j", ".text", obj, bin}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(c, " "), err, out)
		}
	}
	want, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if got := inject.LoaderCode(); string(got) != string(want) {
		t.Fatalf("loader code (%d bytes) differs from testdata/loader.S (%d bytes): regenerate it", len(got), len(want))
	}
}

// TestLoadMT loads the runtime into mt.c started without it and checks
// that every hook slot then points to it and that it records the calls.
func TestLoadMT(t *testing.T) {
	testutil.RequirePtrace(t)
	rt := testutil.Runtime(t, "gcc")
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"mt.c"}})
	p := testutil.Start(t, nil, fx.Path)
	before, err := inject.Inspect(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if before.Runtime != nil || len(before.NeedRouting()) == 0 {
		t.Fatalf("before: runtime %v, %d slots to route (%+v)", before.Runtime, len(before.NeedRouting()), before.Slots)
	}
	res := load(t, p.Pid, rt)
	t.Logf("borrowed thread %d (syscall %d) for %v after %d tries; %d slots; %v in all", res.Tid, res.Syscall, res.Borrowed, res.Tries, res.Entries, res.Elapsed)
	after, err := inject.Inspect(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if after.Runtime == nil {
		t.Fatal("after: no runtime mapped")
	}
	for _, s := range after.Slots {
		if s.State != inject.SlotRouted {
			t.Errorf("after: slot %s %s at %#x is %s (%#x)", s.Object, s.Hook, s.Addr, s.State, s.Value)
		}
	}
	r, err := shm.OpenPID(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p.AwaitProgress(p.Symbol(fx.Path, "progress"), 100000)
	var calls uint64
	for _, f := range r.Functions() {
		calls += f.Entries
	}
	if calls == 0 {
		t.Fatal("the runtime recorded no call")
	}
	out, _ := p.Finish()
	if !strings.Contains(out, "wrong=0") {
		t.Fatalf("program output %q", out)
	}
}

// BenchmarkLoad measures the chosen design (a new thread in the target does
// the dlopen) against the alternative (the borrowed thread does it): how
// long the borrowed thread is away from its own work, and attach to done.
// One fresh mt.c per load: go test -run '^$' -bench Load -benchtime 10x ./internal/inject
func BenchmarkLoad(b *testing.B) {
	testutil.RequirePtrace(b)
	rt := testutil.Runtime(b, "gcc")
	fx := testutil.Build(b, testutil.Spec{Sources: []string{"mt.c"}})
	for _, mode := range []string{"thread", "direct"} {
		b.Run(mode, func(b *testing.B) {
			var borrowed, elapsed time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				p := testutil.Start(b, nil, fx.Path)
				b.StartTimer()
				res := load(b, p.Pid, rt, mode)
				b.StopTimer()
				borrowed += res.Borrowed
				elapsed += res.Elapsed
				p.Finish()
				b.StartTimer()
			}
			b.ReportMetric(float64(borrowed.Microseconds())/float64(b.N), "borrowed-µs/op")
			b.ReportMetric(float64(elapsed.Microseconds())/float64(b.N), "load-µs/op")
		})
	}
}
