package hotpatch

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestSharedTextProcess: a process sharing the target's memory (clone with
// CLONE_VM, not a thread: vmclone.c) runs the target's text, and a tracer
// of the target does not hold it.
//
// Made before hotpatch attaches, it died of SIGTRAP at the first int3 of
// `--protocol int3 --enable work`, which said OK; now every multi-byte
// protocol (int3, int3-async, stop) is refused in one line, exit 1, the
// child alive, and a flip (one byte: safe for any executor) works.
//
// Made while a session traces every thread (reported as a fork), it was
// "repaired" as a copy of the text (whole forms written into the very
// text, mid-protocol) and let go, untraced; now it is traced as one more
// thread, like a vfork child: the session's int3 commands go on and it
// survives them.
func TestSharedTextProcess(t *testing.T) {
	testutil.RequirePtrace(t)
	bin := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"vmclone.c"}}).Path
	env := []string{"LD_PRELOAD=" + testutil.Runtime(t, "gcc")}
	t.Run("before", func(t *testing.T) {
		p := testutil.Start(t, env, bin)
		pid := fmt.Sprint(p.Pid)
		for _, proto := range []string{"int3", "int3-async", "stop"} {
			r := command(t, "hotpatch", "--pid", pid, "--protocol", proto, "--enable", "work")
			if r.Code != 1 || strings.Count(r.Stderr, "\n") != 1 || !strings.Contains(r.Stderr, "shares its memory with process") {
				t.Errorf("--protocol %s: exit %d, stderr %q; want exit 1 and one line saying another process shares its memory", proto, r.Code, r.Stderr)
			}
		}
		hotpatchOK(t, "--pid", pid, "--protocol", "flip", "--enable", "work")
		hotpatchOK(t, "--pid", pid, "--protocol", "flip", "--disable", "work")
		if out, _ := p.Finish(); !strings.Contains(out, "done child=alive") {
			t.Fatalf("the program: %q", out)
		}
	})
	// R6-2: without the runtime in the process, the refusal came after a
	// load (the check needed the tracer): the runtime loaded, its region
	// made, the hook slots rerouted, for a request then refused. Now the
	// sharing process is looked for before the load (D87).
	t.Run("noruntime", func(t *testing.T) {
		t.Setenv(EnvRuntime, testutil.Runtime(t, "gcc"))
		p := testutil.Start(t, nil, bin)
		pid := fmt.Sprint(p.Pid)
		for _, proto := range []string{"int3", "int3-async", "stop"} {
			r := command(t, "hotpatch", "--pid", pid, "--protocol", proto, "--enable", "work")
			if r.Code != 1 || strings.Count(r.Stderr, "\n") != 1 || !strings.Contains(r.Stderr, "shares its memory with process") {
				t.Errorf("--protocol %s, no runtime: exit %d, stderr %q; want exit 1 and one line saying another process shares its memory", proto, r.Code, r.Stderr)
			}
			if reg, err := shm.OpenPID(p.Pid); err == nil || !errors.Is(err, shm.ErrNoRuntime) {
				if err == nil {
					reg.Close()
				}
				t.Fatalf("--protocol %s, refused, loaded the runtime first (stderr %q)", proto, r.Stderr)
			}
		}
		cmd := exec.Command(testutil.Command(t, "hotpatch"), "session", "--pid", pid, "--protocol", "int3")
		cmd.Stdin = strings.NewReader("enable work\n")
		out, err := testutil.OutputBound(cmd)
		if err != nil || !strings.Contains(string(out), `"ok":false`) || !strings.Contains(string(out), "shares its memory with process") {
			t.Errorf("session --protocol int3, enable work: %v, %q; want the command refused", err, out)
		}
		if reg, err := shm.OpenPID(p.Pid); err == nil || !errors.Is(err, shm.ErrNoRuntime) {
			if err == nil {
				reg.Close()
			}
			t.Fatalf("a session's int3 enable, refused, loaded the runtime first (%q)", out)
		}
		// What it was refused for, not the process: a flip loads and works.
		hotpatchOK(t, "--pid", pid, "--protocol", "flip", "--enable", "work")
		if out, _ := p.Finish(); !strings.Contains(out, "done child=alive") {
			t.Fatalf("the program: %q", out)
		}
	})
	t.Run("late", func(t *testing.T) {
		p := testutil.Start(t, env, bin, "late")
		ss := startSession(t, &subject{Process: p}, "--protocol", "int3")
		ss.send(t, "enable work")
		if l := ss.read(t); !l.OK {
			t.Fatalf("enable work (int3): %+v", l)
		}
		if err := syscall.Kill(p.Pid, syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		if line := p.Line(); !strings.HasPrefix(line, "cloned ") {
			t.Fatalf("want the program's clone, got %q", line)
		}
		for _, cmd := range []string{"disable work", "enable work", "disable work"} {
			ss.send(t, cmd)
			if l := ss.read(t); !l.OK {
				t.Fatalf("%s (int3) with a CLONE_VM child made under the session: %+v", cmd, l)
			}
		}
		ss.in.Close()
		ss.wait(t)
		if out, _ := p.Finish(); !strings.Contains(out, "done child=alive") {
			t.Fatalf("the program: %q", out)
		}
	})
}
