package hotpatch

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestStoppedTargetStaysStopped (review7): a program stopped by job control
// (SIGSTOP, Ctrl-Z) before hotpatch comes is toggled with every protocol,
// read by stats, and driven by a session, and each of them ends (exit 0)
// and leaves every thread stopped: hotpatch attaches and detaches, it never
// continues a process its user stopped. (A stop during a session was checked
// by hand: the threads show `t` while attached and `T` after.)
func TestStoppedTargetStaysStopped(t *testing.T) {
	testutil.RequirePtrace(t)
	bin := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"mt.c"}}).Path
	p := testutil.Start(t, []string{"LD_PRELOAD=" + testutil.Runtime(t, "gcc")}, bin)
	pid := fmt.Sprint(p.Pid)
	if err := syscall.Kill(p.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Every thread in the group-stop: watched, with a bound (the kernel
	// gives no event for another process's stop).
	stoppedWithin := func(d time.Duration) bool {
		for deadline := time.Now().Add(d); !allStopped(t, p.Pid); {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(time.Millisecond)
		}
		return true
	}
	if !stoppedWithin(10 * time.Second) {
		t.Fatalf("pid %d not group-stopped 10 s after SIGSTOP", p.Pid)
	}
	// A thread hotpatch detaches while the group-stop holds is woken in the
	// kernel to re-enter it (ptrace's unlink reinstates the pending stop):
	// it shows R for a moment and runs no code of the program's (mt.c's
	// progress counter stays put). A thread hotpatch continued would run
	// mt.c's loop for good and never show T again, so the check waits for
	// the stop, bounded, instead of reading the states once.
	progress := p.Symbol(bin, "progress")
	before := p.Read64(progress)
	check := func(what string) {
		t.Helper()
		if !stoppedWithin(5 * time.Second) {
			t.Errorf("after %s: the stopped program runs again (threads %v, 5 s on)", what, taskStates(t, p.Pid))
		}
		if now := p.Read64(progress); now != before {
			t.Errorf("after %s: the stopped program ran (progress %d -> %d)", what, before, now)
		}
	}
	for _, proto := range []string{ProtoAuto, ProtoFlip, ProtoInt3, ProtoInt3Async, ProtoStop} {
		hotpatchOK(t, "--pid", pid, "--protocol", proto, "--disable", "work")
		check("--protocol " + proto + " --disable work")
		hotpatchOK(t, "--pid", pid, "--protocol", proto, "--enable", "work")
		check("--protocol " + proto + " --enable work")
	}
	if out := hotpatchOK(t, "stats", "--pid", pid).Stdout; !strings.Contains(out, "work") {
		t.Errorf("stats of the stopped program: %q", out)
	}
	check("stats")
	r := testutil.Run(t, "hotpatch", "list", "--pid", pid)
	if r.Code != 0 {
		t.Errorf("list: exit %d: %s", r.Code, r.Stderr)
	}
	check("list")
	ss := exec.Command(testutil.Command(t, "hotpatch"), "session", "--pid", pid, "--protocol", ProtoInt3)
	ss.Stdin = strings.NewReader("disable work\nenable work\nstats\n")
	out, err := testutil.OutputBound(ss)
	if err != nil || strings.Count(string(out), `"ok":true`) != 3 {
		t.Errorf("session: %v, stdout %q", err, out)
	}
	check("session")
	syscall.Kill(p.Pid, syscall.SIGCONT)
	p.Finish()
}

// taskStates are the program's threads' states (/proc/PID/task/TID/stat's
// third field: T stopped, t traced, R, S running or sleeping).
func taskStates(t *testing.T, pid int) []string {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, e.Name()))
		if err != nil {
			continue // the thread ended
		}
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
			out = append(out, s[i+2:i+3])
		}
	}
	return out
}

func allStopped(t *testing.T, pid int) bool {
	t.Helper()
	ss := taskStates(t, pid)
	for _, s := range ss {
		if s != "T" {
			return false
		}
	}
	return len(ss) > 0
}
