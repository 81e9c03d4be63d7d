package elfsafe_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestInflatedProgram: a program whose section headers declare its
// .dynsym compressed, 256 MiB from 256 KiB of zlib (the loader never
// reads section headers: it runs as usual). Before D84, root's `hotpatch
// --enable work` on it inflated the section in the scan and in the
// runtime check (a 1 MiB file made it use 4.3 GB; 256 MiB here, about a
// gigabyte); now it refuses in one line, exit 1, and stays small, and the
// program runs on untouched.
func TestInflatedProgram(t *testing.T) {
	testutil.RequirePtrace(t)
	t.Setenv("EDGEPROBE_RUNTIME", testutil.Runtime(t, "gcc"))
	fx := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"mt.c"}})
	data, err := os.ReadFile(fx.Path)
	if err != nil {
		t.Fatal(err)
	}
	const declared = 256 << 20
	bombed := filepath.Join(t.TempDir(), "mt-inflated")
	if err := os.WriteFile(bombed, Rewrite(t, data, Section{Name: ".dynsym", Declared: declared, Stream: inflate(t, declared)}), 0o755); err != nil {
		t.Fatal(err)
	}
	p := testutil.Start(t, nil, bombed)
	cmd := exec.Command(testutil.Command(t, "hotpatch"), "--pid", fmt.Sprint(p.Pid), "--enable", "work")
	cmd.Env = append(os.Environ(), "EDGEPROBE_CACHE=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	rss := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss // KiB
	if err == nil || cmd.ProcessState.ExitCode() != 1 || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), "compressed") {
		t.Errorf("hotpatch: %v, stderr %q; want exit 1 and one line saying the section is compressed", err, stderr.String())
	}
	if rss > 128<<10 {
		t.Errorf("hotpatch grew to %d MiB reading a file of %d KiB", rss>>10, len(data)>>10)
	}
	t.Logf("hotpatch: max RSS %d MiB; %s", rss>>10, strings.TrimSpace(stderr.String()))
	out, _ := p.Finish()
	if !strings.Contains(out, "wrong=0") {
		t.Errorf("the program: %q", out)
	}
}
