package hotpatch

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestCommandsFileOwner (D93): `hotpatch --commands FILE` run as root, FILE
// in a directory every user may write (/tmp; fs.protected_fifos and
// protected_symlinks are off on many machines, this one included). Another
// user who gets there first chose what root did: a FIFO of theirs was
// opened, root's hotpatch waited in the open until they wrote, and ran their
// `enable work` in the process root named; a file of theirs the same; a
// link of theirs to a device had the device opened and read, one to a file
// of root's had root's file read as commands. Now each is refused in one
// line, exit 1, before anything is read or attached (as is root's own link
// to a device); root's own FIFO and file still work (a FIFO is a legitimate
// use: its open waits for the writer, as before).
func TestCommandsFileOwner(t *testing.T) {
	testutil.RequirePtrace(t)
	other := testutil.OtherUser(t)
	t.Setenv(EnvRuntime, testutil.Runtime(t, "gcc"))
	bin := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"mt.c"}}).Path
	p := testutil.Start(t, nil, bin)
	pid := fmt.Sprint(p.Pid)
	dir := testutil.StickyDir(t, "edgeprobe-commands-")
	hp := testutil.Command(t, "hotpatch")
	// run is root's `hotpatch --commands path`, bounded: a refusal reads
	// nothing and takes milliseconds; a run still going after 10 s waits in
	// an open.
	run := func(path string) (code int, stdout, stderr string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, hp, "--pid", pid, "--commands", path)
		var so, se strings.Builder
		cmd.Stdout, cmd.Stderr = &so, &se
		err := testutil.RunBound(cmd)
		if ctx.Err() != nil {
			return -1, so.String(), se.String()
		}
		code = 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, so.String(), se.String()
	}

	t.Run("other-fifo", func(t *testing.T) {
		fifo := filepath.Join(dir, "fifo")
		other.Run(t, "mkfifo", "-m", "0666", fifo)
		// The other user's writer: its open waits for root's reader.
		w := other.Command("sh", "-c", `echo "enable work" > "$0"`, fifo)
		if err := testutil.StartBound(w); err != nil {
			t.Fatal(err)
		}
		defer func() { w.Process.Kill(); w.Wait() }()
		code, so, se := run(fifo)
		if code != 1 || so != "" || strings.Count(se, "\n") != 1 || !strings.Contains(se, "owned by another user") {
			t.Errorf("another user's FIFO: exit %d, stdout %q, stderr %q; want exit 1, one line: owned by another user", code, so, se)
		}
	})
	t.Run("other-file", func(t *testing.T) {
		f := filepath.Join(dir, "cmds")
		other.Run(t, "sh", "-c", `echo "enable work" > "$0"`, f)
		code, so, se := run(f)
		if code != 1 || so != "" || strings.Count(se, "\n") != 1 || !strings.Contains(se, "owned by another user") {
			t.Errorf("another user's file: exit %d, stdout %q, stderr %q; want exit 1, one line: owned by another user", code, so, se)
		}
	})
	t.Run("other-link-to-device", func(t *testing.T) {
		l := filepath.Join(dir, "link")
		other.Run(t, "ln", "-s", "/dev/zero", l)
		code, so, se := run(l)
		if code != 1 || so != "" || strings.Count(se, "\n") != 1 || !strings.Contains(se, "symbolic link owned by another user") {
			t.Errorf("the other user's link to /dev/zero: exit %d, stdout %.200q, stderr %q; want exit 1, one line: symbolic link owned by another user", code, so, se)
		}
	})
	t.Run("own-link-to-device", func(t *testing.T) {
		l := filepath.Join(dir, "own-link")
		if err := os.Symlink("/dev/zero", l); err != nil {
			t.Fatal(err)
		}
		code, so, se := run(l)
		if code != 1 || so != "" || strings.Count(se, "\n") != 1 || !strings.Contains(se, "nor a FIFO") {
			t.Errorf("root's link to /dev/zero: exit %d, stdout %.200q, stderr %q; want exit 1, one line: not a regular file nor a FIFO", code, so, se)
		}
	})
	t.Run("other-link-to-roots-file", func(t *testing.T) {
		// root's file (in a directory of root's), reached through the other
		// user's link in the sticky directory: passes an owner check.
		roots := filepath.Join(t.TempDir(), "cmds")
		if err := os.WriteFile(roots, []byte("enable work\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		l := filepath.Join(dir, "link2")
		other.Run(t, "ln", "-s", roots, l)
		code, so, se := run(l)
		if code != 1 || so != "" || strings.Count(se, "\n") != 1 || !strings.Contains(se, "symbolic link owned by another user") {
			t.Errorf("the other user's link to root's file: exit %d, stdout %q, stderr %q; want exit 1, one line: symbolic link owned by another user", code, so, se)
		}
	})
	// Root's own: a FIFO written once root's hotpatch opens it, and a file.
	t.Run("own-fifo", func(t *testing.T) {
		fifo := filepath.Join(dir, "own-fifo")
		if err := syscall.Mkfifo(fifo, 0o600); err != nil {
			t.Fatal(err)
		}
		wrote := make(chan error, 1)
		go func() {
			f, err := os.OpenFile(fifo, os.O_WRONLY, 0) // waits for hotpatch's open
			if err == nil {
				_, err = f.WriteString("enable work\ndisable work\n")
				f.Close()
			}
			wrote <- err
		}()
		code, so, se := run(fifo)
		if code != 0 || strings.Count(so, `"ok":true`) != 2 {
			t.Errorf("root's own FIFO: exit %d, stdout %q, stderr %q; want exit 0 and two results ok", code, so, se)
		}
		select {
		case err := <-wrote:
			if err != nil {
				t.Error(err)
			}
		default: // hotpatch never opened it: let the writer go
			if r, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
				r.Close()
			}
			<-wrote
		}
	})
	t.Run("own-file", func(t *testing.T) {
		f := filepath.Join(dir, "own-cmds")
		if err := os.WriteFile(f, []byte("enable work\ndisable work\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		code, so, se := run(f)
		if code != 0 || strings.Count(so, `"ok":true`) != 2 {
			t.Errorf("root's own file: exit %d, stdout %q, stderr %q; want exit 0 and two results ok", code, so, se)
		}
	})
	p.Finish()
}
