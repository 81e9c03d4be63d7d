package hotpatch

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestLeaderExited: a process whose main thread called pthread_exit runs
// on in its other threads, but ptrace cannot attach an exited thread and
// its /proc/PID/mem has no memory behind it: hotpatch cannot work on it.
// Each command must say that in one line and exit 1, not claim the
// process is gone (exit 4: "open /proc/PID/mem: no such process") or that
// root lacks a privilege ("needs root or CAP_SYS_PTRACE"), as it did; and
// the process runs on untouched.
func TestLeaderExited(t *testing.T) {
	testutil.RequirePtrace(t)
	hooks := hooksLib(t)
	fix := testutil.Build(t, testutil.Spec{Sources: []string{"leaderexit.c"}})
	dir := filepath.Dir(fix.Path)
	list := testutil.ProbeList(t, filepath.Join(dir, "leaderexit.json"), fix.Path)
	p := testutil.Start(t, []string{"LD_PRELOAD=" + hooks}, fix.Path)
	awaitLeaderExited(t, p.Pid)
	pid := fmt.Sprint(p.Pid)
	for _, args := range [][]string{
		{"--pid", pid, "--probes", list, "--enable", "work"},
		{"--pid", pid, "--probes", list, "--disable", "work"},
		{"--pid", pid, "--enable", "work"},
		{"session", "--pid", pid, "--probes", list},
		{"repair", "--pid", pid},
		{"list", "--pid", pid},
		{"stats", "--pid", pid},
	} {
		r := command(t, "hotpatch", args...)
		if r.Code != 1 || strings.Count(r.Stderr, "\n") != 1 || !strings.Contains(r.Stderr, "main thread has exited") {
			t.Errorf("hotpatch %s: exit %d, stderr %q; want 1 and one line saying its main thread has exited", strings.Join(args, " "), r.Code, r.Stderr)
		}
	}
	if out, _ := p.Finish(); !strings.HasPrefix(out, "done 1") {
		t.Fatalf("leaderexit: %q", out)
	}
}

// TestLeaderExitsMidSession: the main thread exits while a session holds
// the process. A flip session goes on working (its memory file keeps the
// address space). An int3 session's command cannot stop the exited
// thread, times out and rolls back; its error must say what happened, not
// that the process exited (exit 4, which also ended the session, as it
// did), and the session goes on. The process runs on with whole sites.
func TestLeaderExitsMidSession(t *testing.T) {
	testutil.RequirePtrace(t)
	hooks := hooksLib(t)
	fix := testutil.Build(t, testutil.Spec{Sources: []string{"leaderexit.c"}})
	list := testutil.ProbeList(t, filepath.Join(filepath.Dir(fix.Path), "leaderexit.json"), fix.Path)
	for _, proto := range []string{ProtoAuto, ProtoInt3} {
		t.Run(proto, func(t *testing.T) {
			p := testutil.Start(t, []string{"LD_PRELOAD=" + hooks}, fix.Path, "late")
			ss := startSession(t, &subject{Process: p, probeArgs: []string{"--probes", list}}, "--protocol", proto)
			ss.send(t, "enable work")
			if l := ss.read(t); !l.OK || l.Changed != 2 {
				t.Fatalf("enable before the main thread exits: %+v", l)
			}
			if err := os.WriteFile(p.StopFile+".go", nil, 0o644); err != nil {
				t.Fatal(err)
			}
			awaitLeaderExited(t, p.Pid)
			ss.send(t, "disable work")
			l := ss.read(t)
			if proto == ProtoAuto {
				if !l.OK || l.Changed != 2 {
					t.Errorf("flip disable after the main thread exited: %+v", l)
				}
			} else if l.OK || l.Exit != 1 || !strings.Contains(l.Error, "main thread has exited") || !strings.Contains(l.Error, "sites now: 2 on") {
				t.Errorf("int3 disable after the main thread exited: %+v; want exit 1 naming the exited main thread, sites rolled back", l)
			}
			ss.send(t, "stats")
			if l := ss.read(t); !l.OK || l.Command != "stats" {
				t.Errorf("stats after: %+v (the session must go on)", l)
			}
			ss.in.Close()
			ss.cmd.Wait() // its exit status counts the failed command, if any
			if out, _ := p.Finish(); !strings.HasPrefix(out, "done 1") {
				t.Fatalf("leaderexit: %q", out)
			}
		})
	}
}

// awaitLeaderExited polls until pid's main thread is a zombie with the
// process running on, failing after a minute. (The process's memory is
// not readable through the exited thread, so its progress counter cannot
// be the handshake.)
func awaitLeaderExited(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !procfs.LeaderExited(pid); runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d: the main thread did not exit within a minute", pid)
		}
	}
}
