package capture

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestTopTargetDies: `top` on a program SIGKILLed while it watches ends
// with a last snapshot that says the program exited, also when the
// program's parent has not reaped it yet (a zombie: its /proc entry stays
// until then, which top took for a live process and watched forever).
// With --enable too: the probes' restore on a dead process does not hang.
func TestTopTargetDies(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireTool(t, "setpriv")
	lib := testutil.Runtime(t, "gcc")
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"mt.c"}})
	if r := testutil.Run(t, "coldpatch", fx.Path); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	for _, enable := range []bool{false, true} {
		t.Run(fmt.Sprintf("enable=%v", enable), func(t *testing.T) {
			// The program's parent is a shell that execs sleep, which never
			// waits for it: once killed, the program stays a zombie. It
			// dies with sleep (setpriv's parent-death signal), and sleep
			// with the test: killed, the test binary leaves neither behind.
			sh := exec.Command("sh", "-c", `setpriv --pdeathsig KILL "$0" "$1" & echo $!; exec sleep 600`, fx.Path, t.TempDir()+"/stop")
			sh.Env = append(sh.Environ(), "LD_PRELOAD="+lib)
			sh.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			out, err := sh.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := testutil.StartCmd(sh); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sh.Process.Kill(); sh.Wait() })
			// The shell's "echo $!" and the program's "ready <pid>" race for
			// the pipe: take the two lines in either order, and insist they
			// name the same process.
			rd := bufio.NewReader(out)
			pid, readyPid := 0, 0
			for i := 0; i < 2; i++ {
				line, _ := rd.ReadString('\n')
				line = strings.TrimSpace(line)
				if rest, ok := strings.CutPrefix(line, "ready "); ok {
					readyPid, _ = strconv.Atoi(rest)
				} else if n, err := strconv.Atoi(line); err == nil {
					pid = n
				} else {
					t.Fatalf("the shell printed %q, want the program's pid and its ready line", line)
				}
			}
			if pid == 0 || pid != readyPid {
				t.Fatalf("the shell named pid %d and the program said ready %d: want one pid, both lines", pid, readyPid)
			}
			args := []string{"top", "--pid", fmt.Sprint(pid), "--interval", "50ms", "--count", "200", "--json"}
			if enable {
				args = append(args, "--enable", "work")
			}
			n, exited, stderr, err := topUntilEnd(t, args, func() error { return syscall.Kill(pid, syscall.SIGKILL) })
			if !exited || n >= 200 {
				t.Fatalf("top printed %d of its 200 snapshots, the last with exited=%v, after the program was killed (top: %v, %q)", n, exited, err, stderr)
			}
		})
	}
}

// TestTopTargetExecs: `top` on a program that runs exec while it watches
// ends with a last snapshot marked exited: the counters it watched went
// with the old image (it used to print empty snapshots until --count, or
// for ever without one).
func TestTopTargetExecs(t *testing.T) {
	p := startColdSpec(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", PIE: testutil.Bool(false), Sources: []string{"reexec.c"}}, nil)
	args := []string{"top", "--pid", fmt.Sprint(p.Pid), "--interval", "50ms", "--count", "1000", "--json"}
	n, exited, stderr, err := topUntilEnd(t, args, func() error { return syscall.Kill(p.Pid, syscall.SIGUSR1) })
	if !exited || n >= 1000 {
		t.Fatalf("top printed %d of its 1000 snapshots, the last with exited=%v, after the program ran exec (top: %v, %q)", n, exited, err, stderr)
	}
	if o, _ := p.Finish(); !strings.Contains(o, "done 1") {
		t.Fatalf("program output %q, want done 1 (the new image ended)", o)
	}
}

// topUntilEnd runs `hotpatch` with args (a `top --json`), calls act once
// top printed its first snapshot, and reads snapshots until top ends. It
// returns how many top printed, whether the last said the program exited,
// top's stderr and its exit error.
func topUntilEnd(t *testing.T, args []string, act func() error) (n int, exited bool, stderr string, err error) {
	t.Helper()
	top := exec.Command(testutil.Command(t, "hotpatch"), args...)
	var errBuf strings.Builder
	top.Stderr = &errBuf
	tout, err := top.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := testutil.StartBound(top); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { top.Process.Kill(); top.Wait() })
	lines := bufio.NewScanner(tout)
	lines.Buffer(nil, 1<<20)
	if !lines.Scan() {
		t.Fatalf("top printed nothing: %q", errBuf.String())
	}
	if err := act(); err != nil {
		t.Fatal(err)
	}
	var last struct {
		Exited bool `json:"exited"`
	}
	n = 1
	for lines.Scan() {
		n++
		if err := json.Unmarshal(lines.Bytes(), &last); err != nil {
			t.Fatalf("snapshot %d: %v", n, err)
		}
	}
	err = top.Wait()
	return n, last.Exited, errBuf.String(), err
}
