package testutil

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
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
		dir, err := os.MkdirTemp("", "edgeprobe-cmd-")
		if err != nil {
			c.err = err
			return
		}
		c.path = filepath.Join(dir, name)
		cmd := exec.Command("go", "build", "-o", c.path, "./cmd/"+name)
		cmd.Dir = RepoRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			c.err = errors.New("go build ./cmd/" + name + ": " + err.Error() + "\n" + string(out))
		}
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
	err := cmd.Run()
	var ee *exec.ExitError
	code := 0
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return Result{code, o.String(), e.String()}
}
