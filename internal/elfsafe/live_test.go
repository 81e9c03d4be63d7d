package elfsafe_test

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/elfsafe"
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
	err = testutil.RunBound(cmd)
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

// TestSparseTail (D88 addendum): a program whose executable carries a tail
// of holes after its ELF (nothing in the file describes it; the loader
// never looks; it costs its owner no disk). Before, root's `hotpatch
// --enable work` read every mapped object whole, twice: a 1 GiB tail took
// 24 s and 2.1 GB by hand. Now only what the headers describe is read. A
// tail a section header claims is read only up to MaxObjectBytes: past
// that, the object is refused in one line.
func TestSparseTail(t *testing.T) {
	testutil.RequirePtrace(t)
	t.Setenv("EDGEPROBE_RUNTIME", testutil.Runtime(t, "gcc"))
	fx := testutil.Build(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", Sources: []string{"mt.c"}})
	data, err := os.ReadFile(fx.Path)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	run := func(t *testing.T, bin string, args ...string) (string, int64, int) {
		p := testutil.Start(t, nil, bin)
		cmd := exec.Command(testutil.Command(t, "hotpatch"), append([]string{"--pid", fmt.Sprint(p.Pid)}, args...)...)
		cmd.Env = append(os.Environ(), "EDGEPROBE_CACHE=off")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		testutil.RunBound(cmd)
		rss := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss // KiB
		if out, _ := p.Finish(); !strings.Contains(out, "wrong=0") {
			t.Errorf("the program: %q", out)
		}
		return stderr.String(), rss, cmd.ProcessState.ExitCode()
	}
	t.Run("tail", func(t *testing.T) {
		bin := filepath.Join(dir, "mt-tail")
		if err := os.WriteFile(bin, data, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(bin, int64(len(data))+512<<20); err != nil {
			t.Fatal(err)
		}
		stderr, rss, code := run(t, bin, "--enable", "work")
		if code != 0 {
			t.Errorf("hotpatch --enable work: exit %d, stderr %q", code, stderr)
		}
		if rss > 128<<10 {
			t.Errorf("hotpatch grew to %d MiB on a program of %d KiB with a 512 MiB tail of holes", rss>>10, len(data)>>10)
		}
		t.Logf("hotpatch: max RSS %d MiB", rss>>10)
	})
	t.Run("claimed", func(t *testing.T) {
		bin := filepath.Join(dir, "mt-claimed")
		if err := os.WriteFile(bin, claimTail(t, data, ".comment", elfsafe.MaxObjectBytes), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(bin, int64(len(data))+elfsafe.MaxObjectBytes); err != nil {
			t.Fatal(err)
		}
		stderr, rss, code := run(t, bin, "--enable", "work")
		if code != 1 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "larger than hotpatch reads") {
			t.Errorf("hotpatch --enable work: exit %d, stderr %q; want exit 1 and one line saying the object is too large", code, stderr)
		}
		if rss > 128<<10 {
			t.Errorf("hotpatch grew to %d MiB", rss>>10)
		}
		t.Logf("hotpatch: max RSS %d MiB; %s", rss>>10, strings.TrimSpace(stderr))
	})
}

// claimTail returns data with section name's header moved to the end of
// the file and n bytes long (a section that claims a tail the caller
// appends).
func claimTail(t *testing.T, data []byte, name string, n uint64) []byte {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	out := append([]byte(nil), data...)
	le := binary.LittleEndian
	shoff := le.Uint64(out[40:])
	for i, s := range f.Sections {
		if s.Name == name {
			h := out[shoff+uint64(i)*64:]
			le.PutUint64(h[24:], uint64(len(data)))
			le.PutUint64(h[32:], n)
			return out
		}
	}
	t.Fatalf("no section %s", name)
	return nil
}
