package procmaps_test

import (
	"errors"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/procmaps"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestExecFiles: the executable file-backed mappings PROCMAP_QUERY gives are
// exactly those of the maps' text, a deleted binary's included (its path
// without " (deleted)", Deleted set).
func TestExecFiles(t *testing.T) {
	testutil.RequirePtrace(t)
	fix := testutil.Build(t, testutil.Spec{Sources: []string{"stress.c"}, NoInstr: true})
	pid := run(t, fix.Path)
	if err := os.Remove(fix.Path); err != nil {
		t.Fatal(err)
	}
	for _, p := range []int{os.Getpid(), pid} {
		all, err := procmaps.Read(p)
		if err != nil {
			t.Fatal(err)
		}
		var want []procmaps.Mapping
		for _, m := range all {
			if m.Exec() && m.Inode != 0 && m.Path != "" {
				want = append(want, m)
			}
		}
		got, err := procmaps.ExecFiles(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(want) == 0 || len(got) != len(want) {
			t.Fatalf("pid %d: %d executable file mappings, the text has %d:\n%+v\n%+v", p, len(got), len(want), got, want)
		}
		deleted := false
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("pid %d, mapping %d: %+v, want %+v", p, i, got[i], want[i])
			}
			deleted = deleted || got[i].Deleted
		}
		if p == pid && !deleted {
			t.Errorf("pid %d: the deleted binary's mapping is not marked deleted: %+v", p, got)
		}
	}
	if _, err := procmaps.ExecFiles(-1); !errors.Is(err, procmaps.ErrNoProcess) {
		t.Errorf("pid -1: %v, want ErrNoProcess", err)
	}
}

// BenchmarkExecMappings: what the pristine check's two maps reads per flip
// batch cost, through PROCMAP_QUERY (ExecFiles) and through the text
// (ReadExec), on this process.
func BenchmarkExecMappings(b *testing.B) {
	for _, v := range []struct {
		name string
		read func(int) ([]procmaps.Mapping, error)
	}{{"ExecFiles", procmaps.ExecFiles}, {"ReadExec", procmaps.ReadExec}} {
		b.Run(v.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if _, err := v.read(os.Getpid()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestMapsCovering: Maps.Covering answers, for every mapping of the maps'
// text, at its first and last byte, that mapping (path aside); for the
// byte below the lowest one, nothing; once the process is gone,
// ErrNoProcess.
func TestMapsCovering(t *testing.T) {
	testutil.RequirePtrace(t)
	fix := testutil.Build(t, testutil.Spec{Sources: []string{"stress.c"}, NoInstr: true})
	pid := run(t, fix.Path)
	m, err := procmaps.OpenMaps(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	all, err := procmaps.Read(pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range all {
		if want.Path == "[vsyscall]" { // not a VMA of the process: the query does not see it
			continue
		}
		want.Path, want.Deleted = "", false
		for _, addr := range []uint64{want.Start, want.End - 1} {
			got, ok, err := m.Covering(addr)
			if err != nil || !ok || got != want {
				t.Errorf("%#x: %+v, %v, %v; want %+v", addr, got, ok, err, want)
			}
		}
	}
	if all[0].Start > 0 {
		if got, ok, err := m.Covering(all[0].Start - 1); ok || err != nil {
			t.Errorf("%#x, below every mapping: %+v, %v, %v", all[0].Start-1, got, ok, err)
		}
	}
	if !m.Queries() {
		t.Log("this kernel has no PROCMAP_QUERY: Covering read the text")
	}
	syscall.Kill(pid, syscall.SIGKILL)
	for deadline := time.Now().Add(time.Minute); ; {
		if time.Now().After(deadline) {
			t.Fatal("a minute after SIGKILL, Covering still answers")
		}
		_, _, err := m.Covering(all[0].Start)
		if errors.Is(err, procmaps.ErrNoProcess) {
			break
		}
		if err != nil {
			t.Fatalf("after SIGKILL: %v, want ErrNoProcess", err)
		}
		runtime.Gosched() // the kernel tears the address space down after the kill
	}
}
