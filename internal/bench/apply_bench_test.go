package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/hotpatch"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// BenchmarkSessionApply is row 2b's session path on the batch program
// (40,000 probes): one Session.Apply enabling or disabling every probe, as
// `hotpatch --enable '*'` does after its lock and list, for profiling
// (go test -bench SessionApply -cpuprofile). The rows report the figures.
func BenchmarkSessionApply(b *testing.B) {
	testutil.RequirePtrace(b)
	ctx := context.Background()
	out := filepath.Join(os.TempDir(), "edgeprobe-bench-test")
	h, err := New(testutil.RepoRoot(b), out, Tiny())
	if err != nil {
		b.Fatal(err)
	}
	const n = 20_000
	bin, err := h.buildMany(n, false)
	if err != nil {
		b.Fatal(err)
	}
	flipBin, l, err := h.B.Cold(bin, fmt.Sprintf("many%d-flip", n), probelist.PlaceholderFlip)
	if err != nil {
		b.Fatal(err)
	}
	t, err := Start(ctx, nil, flipBin, "exec")
	if err != nil {
		b.Fatal(err)
	}
	defer t.Kill()
	listFile := filepath.Join(h.B.Dir, fmt.Sprintf("many%d-flip.apply.probes.json", n))
	if err := l.WriteFile(listFile); err != nil {
		b.Fatal(err)
	}
	s, err := hotpatch.Open(t.Pid, []string{listFile}, false)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	s.SetBrief(true)
	all, err := probelist.ParseSelector("*", "")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("classify", func(b *testing.B) {
		// One grouped read of every site, the floor of a pass over the text.
		sites, err := Sites(t.Pid, l, "", "")
		if err != nil {
			b.Fatal(err)
		}
		p, err := xmod.Prepare(changes(sites, true))
		if err != nil {
			b.Fatal(err)
		}
		mem, err := ptrace.OpenMem(t.Pid)
		if err != nil {
			b.Fatal(err)
		}
		defer mem.Close()
		var st []xmod.State
		var r0, r1 syscall.Rusage
		b.ResetTimer()
		syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
		for i := 0; i < b.N; i++ {
			if st, err = p.Classify(mem, st); err != nil {
				b.Fatal(err)
			}
		}
		syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
		per := float64(b.N) * float64(len(l.Probes))
		b.ReportMetric(float64(r1.Stime.Nano()-r0.Stime.Nano())/per, "sys-ns/probe")
		b.ReportMetric(float64(r1.Utime.Nano()-r0.Utime.Nano())/per, "user-ns/probe")
	})
	for _, v := range []struct{ spans, first bool }{{false, false}, {true, true}, {true, false}} {
		name := fmt.Sprintf("spans=%v", v.spans)
		if v.first {
			name += ",first" // each batch a selection's first (D61)
		}
		b.Run(name, func(b *testing.B) {
			set := h.sessionSet(ctx, s, all, v.spans, v.first, nil)
			for _, on := range []bool{true, false} { // warm: verified, both selections prepared
				if err := set(on); err != nil {
					b.Fatal(err)
				}
			}
			var r0, r1 syscall.Rusage
			var m0, m1 runtime.MemStats
			b.ReportAllocs()
			runtime.ReadMemStats(&m0)
			q0 := runDelay()
			b.ResetTimer()
			syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
			for i := 0; i < b.N; i++ {
				if err := set(i%2 == 0); err != nil {
					b.Fatal(err)
				}
			}
			syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
			b.StopTimer()
			q1 := runDelay()
			runtime.ReadMemStats(&m1)
			per := float64(b.N) * float64(len(l.Probes))
			// Where wall time beyond CPU time went (D74): this process's
			// threads runnable but not running (the run queue), and
			// collections and page faults per batch.
			b.ReportMetric(float64(q1-q0)/per, "runq-ns/probe")
			b.ReportMetric(float64(m1.NumGC-m0.NumGC)/float64(b.N), "gc/op")
			b.ReportMetric(float64(r1.Minflt-r0.Minflt)/float64(b.N), "minflt/op")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/per, "ns/probe")
			// Under load, CPU time (every thread of this process, the
			// kernel's copying of the target's memory included) says more
			// than wall time.
			cpu := func(r syscall.Rusage) float64 { return float64(r.Utime.Nano() + r.Stime.Nano()) }
			b.ReportMetric((cpu(r1)-cpu(r0))/per, "cpu-ns/probe")
			b.ReportMetric(float64(r1.Stime.Nano()-r0.Stime.Nano())/per, "sys-ns/probe")
		})
	}
}

// runDelay is the time this process's threads have spent runnable but not
// running (the second field of each /proc/self/task/TID/schedstat), in ns.
func runDelay() int64 {
	ents, _ := os.ReadDir("/proc/self/task")
	var sum int64
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", e.Name(), "schedstat"))
		if err != nil {
			continue // the thread exited
		}
		if f := strings.Fields(string(b)); len(f) >= 2 {
			d, _ := strconv.ParseInt(f[1], 10, 64)
			sum += d
		}
	}
	return sum
}

// BenchmarkSessionStream is row 7's streamed toggles through `hotpatch
// session` (each command enables or disables probed(), 2 probes), with the
// session process's own CPU time per command, for profiling the command
// path (EDGEPROBE_SESSION_CPUPROFILE is not offered: use perf on the pid).
func BenchmarkSessionStream(b *testing.B) {
	testutil.RequirePtrace(b)
	ctx := context.Background()
	out := filepath.Join(os.TempDir(), "edgeprobe-bench-test")
	h, err := New(testutil.RepoRoot(b), out, Tiny())
	if err != nil {
		b.Fatal(err)
	}
	flipBin, _, flipList, _, err := h.toggleBuilds()
	if err != nil {
		b.Fatal(err)
	}
	list := filepath.Join(h.B.Dir, "toggle-flip.stream.probes.json")
	if err := flipList.WriteFile(list); err != nil {
		b.Fatal(err)
	}
	hp, err := h.buildHotpatch()
	if err != nil {
		b.Fatal(err)
	}
	t, err := h.startToggle(ctx, flipBin, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer t.Kill()
	s, err := startScript(ctx, hp, h.B.Dir, "--pid", fmt.Sprint(t.Pid), "--probes", list)
	if err != nil {
		b.Fatal(err)
	}
	defer s.close()
	if _, err := s.stream(1000); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	rate, err := s.stream(b.N)
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if err := s.finish(); err != nil {
		b.Fatal(err)
	}
	st := s.cmd.ProcessState
	b.ReportMetric(rate, "toggles/s")
	b.ReportMetric(float64((st.UserTime()+st.SystemTime()).Nanoseconds())/float64(b.N+1000), "session-cpu-ns/toggle")
	b.ReportMetric(float64(st.SystemTime().Nanoseconds())/float64(b.N+1000), "session-sys-ns/toggle")
}
