package capture

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// The runtime under a seccomp filter that kills the program for each system
// call the runtime may make in a hook or while setting itself up
// (sandboxsys.c, D56): process_vm_readv, sigaltstack, gettid, getpid,
// memfd_create, arch_prctl. After the sandbox the program makes the runtime
// reach for all of them: signals on an alternate stack above the thread's
// own (the busy word's and the shadow stack's checks), a new thread (its
// slot claim), a fork child (its region), the exit handler; fentry adds a
// new thread's return-address stack and the return stack's resync.

type sandboxRun struct {
	p        *testutil.Process
	bin      string
	go1, go2 string
}

func startSandbox(t *testing.T, spec testutil.Spec, preload bool, mode string, extra ...string) *sandboxRun {
	t.Helper()
	testutil.RequirePtrace(t)
	spec.Sources = []string{"sandboxsys.c"}
	spec.LDFlags = append(spec.LDFlags, "-pthread", "-ldl", "-lrt")
	fx := testutil.Build(t, spec)
	dir := t.TempDir()
	r := &sandboxRun{bin: fx.Path, go1: filepath.Join(dir, "go"), go2: filepath.Join(dir, "go2")}
	var env []string
	if preload {
		env = append(env, "LD_PRELOAD="+testutil.Runtime(t, spec.Compiler))
	}
	r.p = testutil.Start(t, env, fx.Path, append([]string{r.go1, r.go2, mode}, extra...)...)
	return r
}

// step writes the file the program waits for and waits until its phase
// variable reaches want.
func (r *sandboxRun) step(t *testing.T, file string, want uint64) {
	t.Helper()
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	addr := r.p.Symbol(r.bin, "phase")
	deadline := time.Now().Add(time.Minute)
	for {
		if !r.p.Alive() {
			t.Fatalf("the program died before phase %d: %v", want, r.p.Wait())
		}
		if r.p.Read64(addr) >= want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("phase %d not reached in a minute", want)
		}
		time.Sleep(time.Millisecond)
	}
}

var sandboxDone = regexp.MustCompile(`done handled=(\d+) child=(-?\d+)`)

func (r *sandboxRun) finish(t *testing.T) (stderr string) {
	t.Helper()
	out, stderr := r.p.Finish() // fails the test if the program did not exit 0
	m := sandboxDone.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("program output %q", out)
	}
	if n, _ := strconv.Atoi(m[1]); n < 1000 || m[2] != "0" {
		t.Fatalf("program output %q: want 1,000 signals handled and the fork child's exit status 0", out)
	}
	return stderr
}

// TestSandboxNoSyscalls: a program sandboxes itself, every thread at once,
// through libc's syscall(SYS_seccomp) (the preloaded runtime's interposer
// sees it) or with a raw syscall instruction (nothing in the process sees
// it: a capture, here a 20 ms trace, finds it in /proc and tells the
// runtime). Then it does everything that made the runtime call what the
// filter kills for, and must exit 0: signals on its alternate stack
// handled, the fork child's status 0. The region says what changed: nosys
// set, the system calls left out counted; the thread started after the
// sandbox is recorded under the id glibc keeps in its descriptor. Without D56 the program dies of SIGSYS in
// both modes (gettid of the new thread, sigaltstack of a handler's hook).
func TestSandboxNoSyscalls(t *testing.T) {
	for _, spec := range []testutil.Spec{
		{Compiler: "gcc"},
		{Compiler: "clang"},
		{Compiler: "gcc", NoInstr: true, Profile: testutil.ProfileFentry},
	} {
		for _, mode := range []string{"libc", "raw"} {
			t.Run(spec.String()+"-"+mode, func(t *testing.T) {
				r := startSandbox(t, spec, true, mode)
				r.step(t, r.go1, 1)
				if mode == "raw" {
					run(t, "trace", "--pid", fmt.Sprint(r.p.Pid), "--duration", "20ms", "--format", "text")
				}
				r.step(t, r.go2, 2)
				region, err := shm.OpenPID(r.p.Pid)
				if err != nil {
					t.Fatal(err)
				}
				c := region.Counters()
				threads := region.Threads()
				region.Close()
				if !c.Nosys || c.NosysThreads != 0 || c.NosysSkips < 1 {
					t.Errorf("region: nosys %v, %d threads not recorded, %d system calls left out; want set, 0, >= 1",
						c.Nosys, c.NosysThreads, c.NosysSkips)
				}
				// the thread started after the sandbox is recorded under the id
				// glibc keeps for it (no gettid)
				w := int32(r.p.Read64(r.p.Symbol(r.bin, "wtid")))
				late := int32(r.p.Read64(r.p.Symbol(r.bin, "late_tid")))
				var ids []int32
				for _, th := range threads {
					ids = append(ids, th.Tid)
				}
				if late <= 0 || len(ids) != 2 || !(ids[0] == w && ids[1] == late || ids[1] == w && ids[0] == late) {
					t.Errorf("thread slots of %v; want the worker %d and the thread started after the sandbox %d", ids, w, late)
				}
				r.finish(t)
			})
		}
	}
}

// TestSandboxDlopen: the runtime loaded with dlopen into a program already
// under the filter (what an injection that raced with the sandbox would
// do): its set-up finds the Seccomp: field at load and makes no region
// (memfd_create, getpid would kill the program); the program runs on.
func TestSandboxDlopen(t *testing.T) {
	r := startSandbox(t, testutil.Spec{Compiler: "gcc"}, false, "dlopen", testutil.Runtime(t, "gcc"))
	r.step(t, r.go1, 1)
	if _, err := shm.OpenPID(r.p.Pid); !errors.Is(err, shm.ErrNoRuntime) {
		t.Errorf("OpenPID after the sandboxed load: %v; want no region (ErrNoRuntime)", err)
	}
	r.step(t, r.go2, 2)
	if stderr := r.finish(t); !strings.Contains(stderr, "loaded") {
		t.Errorf("stderr %q: want the load reported", stderr)
	}
}

// TestInjectRefusedThreadSandbox: one thread sandboxed alone (prctl, no
// TSYNC: the main thread's status shows no seccomp). A capture that would
// load the runtime into the process refuses, in one line, before touching
// it, and the program runs on. (Before D56 the preflight read the main
// thread's status only: the injection ran memfd_create in the sandboxed
// thread and the program died.)
func TestInjectRefusedThreadSandbox(t *testing.T) {
	r := startSandbox(t, testutil.Spec{Compiler: "gcc"}, false, "thread")
	r.step(t, r.go1, 1)
	res := testutil.Run(t, "hotpatch", "trace", "--pid", fmt.Sprint(r.p.Pid), "--duration", "20ms", "--format", "text")
	if res.Code == 0 || strings.Count(strings.TrimSpace(res.Stderr), "\n") != 0 || !strings.Contains(res.Stderr, "threads run under seccomp") {
		t.Fatalf("trace: exit %d, stderr %q; want a one-line refusal naming the sandboxed thread", res.Code, res.Stderr)
	}
	r.step(t, r.go2, 2)
	r.finish(t)
}
