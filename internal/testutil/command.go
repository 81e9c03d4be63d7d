package testutil

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var commands sync.Map // name -> *commandBuild

type commandBuild struct {
	once sync.Once
	path string
	err  error
}

// Command builds ./cmd/NAME once per test binary and returns its path.
// Tests that patch a live process run the real command as a separate
// process: a test that both parents and traces a target would race its own
// wait4 against the tracer's.
func Command(t testing.TB, name string) string {
	t.Helper()
	v, _ := commands.LoadOrStore(name, &commandBuild{})
	c := v.(*commandBuild)
	c.once.Do(func() {
		// One directory per checkout in the fixture cache, not a fresh temp
		// directory per test binary (a run left one per package behind).
		// Each binary builds afresh and renames into place: test binaries
		// of one run build the same source, and a rename never shows a
		// half-written file to one that is starting it.
		root := RepoRoot(t)
		dir := filepath.Join(cacheDir(t), fmt.Sprintf("cmd-%x", sha256.Sum256([]byte(root)))[:len("cmd-")+16])
		if err := os.MkdirAll(dir, 0o755); err != nil {
			c.err = err
			return
		}
		c.path = filepath.Join(dir, name)
		tmp := fmt.Sprintf("%s.%d.tmp", c.path, os.Getpid())
		cmd := exec.Command("go", "build", "-o", tmp, "./cmd/"+name)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // as make builds it (D67)
		if out, err := cmd.CombinedOutput(); err != nil {
			os.Remove(tmp)
			c.err = errors.New("go build ./cmd/" + name + ": " + err.Error() + "\n" + string(out))
			return
		}
		c.err = os.Rename(tmp, c.path)
	})
	if c.err != nil {
		t.Fatal(c.err)
	}
	return c.path
}

// Result is a finished command.
type Result struct {
	Code           int
	Stdout, Stderr string
}

// Run runs a command built by Command and returns its exit code and output.
func Run(t testing.TB, name string, args ...string) Result {
	t.Helper()
	cmd := exec.Command(Command(t, name), args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := RunBound(cmd)
	var ee *exec.ExitError
	code := 0
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return Result{code, o.String(), e.String()}
}

// RunOK is Run that fails the test unless the command exits 0.
func RunOK(t testing.TB, name string, args ...string) Result {
	t.Helper()
	r := Run(t, name, args...)
	if r.Code != 0 {
		t.Fatalf("%s %s: exit %d: %s", name, strings.Join(args, " "), r.Code, r.Stderr)
	}
	return r
}

// ProbeList runs coldpatch on bin (with args before it, e.g. "--placeholder",
// "nop") and writes the probe list it prints to path, which it returns; a
// coldpatch that fails, or a list that cannot be written, fails the test.
func ProbeList(t testing.TB, path, bin string, args ...string) string {
	t.Helper()
	r := Run(t, "coldpatch", append(args, bin)...)
	if r.Code != 0 {
		t.Fatalf("coldpatch %s: %s", bin, r.Stderr)
	}
	if err := os.WriteFile(path, []byte(r.Stdout), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
