package shm

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// The region is an anonymous memfd (decision D16): nobody can plant, read or
// truncate it by name, hotpatch finds it through /proc/PID/fd and checks
// whom it belongs to, and nothing outlives the process.

// TestRegionHostileNeighbour: another user pre-creates, for the next few
// hundred pids, every file name the runtime ever used in /dev/shm (files and
// symlinks to a file of theirs) before the target starts. The target runs,
// its region is its own (the planted files stay empty), OpenPID finds the
// real region, and the other user cannot open it.
func TestRegionHostileNeighbour(t *testing.T) {
	other := testutil.OtherUser(t)
	testutil.RequirePtrace(t)
	lib := buildRuntime(t, "gcc")
	bin := testutil.Build(t, testutil.Spec{Sources: []string{"mt.c"}}).Path
	last, err := os.ReadFile("/proc/sys/kernel/ns_last_pid")
	if err != nil {
		testutil.Unavailable(t, "cannot predict pids: %v", err)
	}
	next, _ := strconv.Atoi(strings.TrimSpace(string(last)))
	// A directory the other user can reach (t.TempDir's parents are 0700).
	dir, err := os.MkdirTemp("/tmp", "edgeprobe-other-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o777)
	bait := filepath.Join(dir, "bait")
	// One process plants them all: every fork would use up a pid.
	const span = 2000
	planter := filepath.Join(dir, "plant")
	if b, err := os.ReadFile(testutil.Build(t, testutil.Spec{Sources: []string{"plant.c"}, NoInstr: true}).Path); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(planter, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := testutil.CombinedOutputBound(other.Command(planter, bait, strconv.Itoa(next), strconv.Itoa(span))); err != nil {
		t.Fatalf("planting as %s: %v: %s", other.Name, err, out)
	}
	t.Cleanup(func() {
		for p := next; p < next+span; p++ {
			os.Remove(fmt.Sprintf("/dev/shm/edgeprobe.%d", p))
			os.Remove(fmt.Sprintf("/dev/shm/.edgeprobe.init.%d", p))
		}
	})
	p := testutil.Start(t, []string{"LD_PRELOAD=" + lib}, bin)
	if p.Pid < next || p.Pid >= next+span {
		t.Logf("target pid %d outside the planted range %d..%d (busy machine): the planted names were not its own", p.Pid, next, next+span-1)
	}
	r, err := OpenPID(p.Pid)
	if err != nil {
		t.Fatalf("OpenPID of the target: %v", err)
	}
	defer r.Close()
	progress := p.Symbol(bin, "progress")
	p.AwaitProgress(progress, 10000)
	if fs := byName(t, r, mustMaps(t, p.Pid)); fs["work"].Entries == 0 {
		t.Errorf("the region records nothing: %v", fs)
	}
	for _, name := range []string{bait, fmt.Sprintf("/dev/shm/edgeprobe.%d", p.Pid)} {
		if st, err := os.Stat(name); err == nil && st.Size() != 0 {
			t.Errorf("%s: %d bytes written into a planted file", name, st.Size())
		}
	}
	// The other user cannot list the target's descriptors, let alone open
	// the region.
	hp := testutil.Command(t, "hotpatch")
	pub := filepath.Join(dir, "hotpatch")
	if b, err := os.ReadFile(hp); err == nil {
		os.WriteFile(pub, b, 0o755)
	}
	out, err := testutil.CombinedOutputBound(other.Command(pub, "stats", "--pid", strconv.Itoa(p.Pid)))
	if err == nil || !strings.Contains(string(out), "permission denied") && !strings.Contains(string(out), "ptrace rights") {
		t.Errorf("hotpatch stats as %s: %v: %q; want a refusal (permission denied)", other.Name, err, out)
	}
	// What OpenPID needs, the other user is denied: the descriptor list.
	if out, err := other.Command("ls", fmt.Sprintf("/proc/%d/fd", p.Pid)).CombinedOutput(); err == nil {
		t.Errorf("%s lists the target's descriptors: %s", other.Name, out)
	}
	if out, _ := p.Finish(); !strings.Contains(out, "wrong=0") {
		t.Fatalf("target output %q", out)
	}
}

func mustMaps(t testing.TB, pid int) []byte {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRegionUntrusted: a process holding a memfd named like the region but
// describing another process (a copy of another run's output file) is
// refused, by OpenPID and by hotpatch, with a message that says why.
func TestRegionUntrusted(t *testing.T) {
	lib := buildRuntime(t, "gcc")
	bin := testutil.Build(t, testutil.Spec{Sources: []string{"region.c"}}).Path
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, lib, bin, []string{"EDGEPROBE_OUTPUT=" + out}, "exit")
	if _, err := os.Stat(out); err == nil {
		t.Fatalf("_exit wrote %s: the destructor ran", out)
	}
	// A valid region of another process: an output file of a normal run.
	valid := filepath.Join(t.TempDir(), "valid")
	counts, libdir := buildCounts(t, "gcc", "-O2")
	mustRun(t, lib, counts, []string{"LD_LIBRARY_PATH=" + libdir, "EDGEPROBE_OUTPUT=" + valid}, "10")
	// Built without hooks, so that hotpatch has nothing to load a runtime
	// for and goes straight to the region.
	plain := testutil.Build(t, testutil.Spec{Sources: []string{"region.c"}, NoInstr: true}).Path
	p := testutil.Start(t, nil, plain, "fake", valid)
	_, err := OpenPID(p.Pid)
	if !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), "describes pid") {
		t.Errorf("OpenPID of a process holding another's region: %v, want ErrUntrusted naming the pid", err)
	}
	r := testutil.Run(t, "hotpatch", "stats", "--pid", strconv.Itoa(p.Pid))
	if r.Code == 0 || !strings.Contains(r.Stderr, "not trusted") || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
		t.Errorf("hotpatch stats: exit %d, stderr %q; want one line saying the region is not trusted", r.Code, r.Stderr)
	}
	p.Finish()
}

// TestRegionLeavesNothing: processes that end by SIGKILL, by _exit, or by a
// daemonising fork (parent and child _exit) leave nothing in /dev/shm, and
// a memfd of theirs is gone with them.
func TestRegionLeavesNothing(t *testing.T) {
	lib := buildRuntime(t, "gcc")
	bin := testutil.Build(t, testutil.Spec{Sources: []string{"region.c"}}).Path
	mt := testutil.Build(t, testutil.Spec{Sources: []string{"mt.c"}}).Path

	p := testutil.Start(t, []string{"LD_PRELOAD=" + lib}, mt)
	if r, err := OpenPID(p.Pid); err != nil {
		t.Fatalf("live region: %v", err)
	} else {
		r.Close()
	}
	p.Cmd.Process.Signal(syscall.SIGKILL)
	p.Wait()
	noShm(t, p.Pid)
	if _, err := OpenPID(p.Pid); !errors.Is(err, ErrNoRuntime) {
		t.Errorf("OpenPID after SIGKILL: %v", err)
	}

	cmd := exec.Command(bin, "exit")
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib)
	if err := testutil.RunBound(cmd); err != nil {
		t.Fatal(err)
	}
	noShm(t, cmd.Process.Pid)

	pidFile := filepath.Join(t.TempDir(), "pid")
	cmd = exec.Command(bin, "daemon", pidFile)
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib)
	if err := testutil.RunBound(cmd); err != nil {
		t.Fatal(err)
	}
	noShm(t, cmd.Process.Pid)
	// The child writes its pid last, then _exits: wait for the file, then
	// for the process to be gone (it is not ours to wait for).
	var child int
	waitFor(t, "the daemon's pid file", func() bool {
		b, err := os.ReadFile(pidFile)
		if err == nil && strings.HasSuffix(string(b), "\n") {
			child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			return true
		}
		return false
	})
	waitFor(t, "the daemon's exit", func() bool { return !alive(child) })
	noShm(t, child)
}

// alive reports whether pid runs (a zombie has released its files: dead).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

// waitFor polls cond, a state another process advances, failing after a
// minute.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		runtime.Gosched()
	}
}

// TestIdleRegionMemory: a process with the runtime preloaded and no probe
// enabled (a cold binary: every site inert) holds at most 1 MiB of region
// memory, the region's resident size in /proc/PID/smaps; with everything
// on it grows with what is recorded.
func TestIdleRegionMemory(t *testing.T) {
	lib := buildRuntime(t, "gcc")
	bin := testutil.Build(t, testutil.Spec{Sources: []string{"mt.c"}}).Path
	if r := testutil.Run(t, "coldpatch", bin); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	p := testutil.Start(t, []string{"LD_PRELOAD=" + lib}, bin)
	p.AwaitProgress(p.Symbol(bin, "progress"), 100000)
	rss, size := regionRss(t, p.Pid)
	m, err := ReadMemory(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("idle region: %d KiB resident of %d KiB, %d KiB in a core dump", rss, size, m.DumpedKiB)
	// The function table's reserve beyond its first segment is left out of
	// core dumps (a dump would read, and allocate, every page).
	if m.DumpedKiB == 0 || m.DumpedKiB > 64<<10 {
		t.Errorf("a core dump would read %d KiB of the region, want (0, 64 MiB]", m.DumpedKiB)
	}
	// Reading the region must not make it hold more: every scan hotpatch
	// makes (stats, threads, a generation bump) skips the pages no writer
	// touched instead of faulting them in (extents.go). Before, one
	// Functions call made an idle region hold 7.4 MiB.
	r, err := OpenPID(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	r.Functions()
	r.Counters()
	if _, err := r.NewGeneration([]uint64{p.Symbol(bin, "work"), 0x1234}); err != nil {
		t.Fatal(err)
	}
	r.Close()
	after, err := ReadMemory(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("region file holds %d KiB before the reads, %d KiB after", m.AllocatedKiB, after.AllocatedKiB)
	if m.AllocatedKiB == 0 || after.AllocatedKiB > 1024 {
		t.Errorf("the idle region's file holds %d KiB (before reading it: %d KiB), want (0, 1024]", after.AllocatedKiB, m.AllocatedKiB)
	}
	if rss > 1024 {
		t.Errorf("idle region holds %d KiB, want <= 1024", rss)
	}
	if size < 4*1024 {
		t.Errorf("region mapping %d KiB: not the region?", size)
	}
	p.Finish()
}

// regionRss returns the resident and total size in KiB of the process's
// region mapping (/memfd:edgeprobe in smaps).
func regionRss(t testing.TB, pid int) (rss, size int) {
	t.Helper()
	m, err := ReadMemory(pid)
	if err != nil {
		t.Fatal(err)
	}
	return int(m.ResidentKiB), int(m.SizeKiB)
}

// TestReserveFirstSegment: EDGEPROBE_RESERVE=1 allocates, at start-up, the
// region's fixed part and the function table's first segment (no page
// fault later can meet a memory limit there), and nothing of the table's
// reserve beyond it, which stays address space (D35).
func TestReserveFirstSegment(t *testing.T) {
	lib := buildRuntime(t, "gcc")
	bin := testutil.Build(t, testutil.Spec{Sources: []string{"mt.c"}}).Path
	if r := testutil.Run(t, "coldpatch", bin); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	p := testutil.Start(t, []string{"LD_PRELOAD=" + lib, "EDGEPROBE_RESERVE=1"}, bin)
	p.AwaitProgress(p.Symbol(bin, "progress"), 1000)
	r, err := OpenPID(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	h := r.Header()
	r.Close()
	m, err := ReadMemory(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	want := (h.KeysOff + uint64(h.FuncFirst)*(8+funcSize)) >> 10
	t.Logf("reserved region: file holds %d KiB, fixed part and first segment %d KiB, mapped %d KiB", m.AllocatedKiB, want, m.SizeKiB)
	if m.AllocatedKiB < want || m.AllocatedKiB > want+1024 || m.AllocatedKiB*4 > m.SizeKiB {
		t.Errorf("file holds %d KiB, want %d..%d KiB (the fixed part and the first segment) of %d KiB mapped", m.AllocatedKiB, want, want+1024, m.SizeKiB)
	}
	p.Finish()
}
