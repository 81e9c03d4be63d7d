package coldpatch

import (
	"bytes"
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/elfscan"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// hooksLib builds the counting hooks (testdata/fixtures/hooks.c) as a
// preloadable library.
func hooksLib(t *testing.T) string {
	t.Helper()
	return testutil.Build(t, testutil.Spec{Sources: []string{"hooks.c"}, Shared: true, NoInstr: true, Name: "libhooks.so"}).Path
}

var hooksLine = regexp.MustCompile(`hooks enters=(\d+) exits=(\d+)`)

// runCounted runs bin and returns its stdout and how many times the hooks ran.
func runCounted(t *testing.T, bin, preload string) (string, int, int) {
	t.Helper()
	cmd := exec.Command(bin, "12")
	if preload != "" {
		cmd.Env = append(os.Environ(), "LD_PRELOAD="+preload)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := testutil.RunBound(cmd); err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, stderr.Bytes())
	}
	m := hooksLine.FindSubmatch(stderr.Bytes())
	if m == nil {
		t.Fatalf("%s printed no hook counts (stderr %q)", bin, stderr.Bytes())
	}
	enters, _ := strconv.Atoi(string(m[1]))
	exits, _ := strconv.Atoi(string(m[2]))
	return stdout.String(), enters, exits
}

// TestColdBinaries runs the whole matrix: the cold binary must print what the
// original prints and never reach a hook, and exactly the bytes the probe
// list names may change.
func TestColdBinaries(t *testing.T) {
	lib := hooksLib(t)
	for _, spec := range testutil.Matrix("basic.c") {
		preload := lib
		if spec.Static {
			// A static binary cannot preload: link the counting hooks in,
			// which also covers hooks defined in the binary (direct calls).
			spec.Sources = []string{"basic.c", "hooks.c"}
			preload = ""
		}
		t.Run(spec.String(), func(t *testing.T) {
			fx := testutil.Build(t, spec)
			if spec.Static && spec.Strip {
				// Nothing names the hooks of a stripped static binary: the
				// answer is a clear error (coldpatch before stripping; the
				// probe list then serves the stripped copy, see hotpatch's
				// TestStrippedAfterColdpatch).
				if _, err := Run(fx.Path, Options{}); !errors.Is(err, elfscan.ErrNoHookSites) {
					t.Fatalf("stripped static binary: %v, want ErrNoHookSites", err)
				}
				return
			}
			orig, err := os.ReadFile(fx.Path)
			if err != nil {
				t.Fatal(err)
			}
			wantOut, enters, exits := runCounted(t, fx.Path, preload)
			if enters == 0 || enters != exits {
				t.Fatalf("original binary: hooks ran %d/%d times, want equal and positive (%s)", enters, exits, fx.Command)
			}

			cold := filepath.Join(t.TempDir(), "cold")
			res, err := Run(fx.Path, Options{Output: cold})
			if err != nil {
				t.Fatalf("%s: %v", fx.Command, err)
			}
			if res.Patched != len(res.List.Probes) || res.Patched == 0 {
				t.Fatalf("patched %d of %d probes", res.Patched, len(res.List.Probes))
			}
			if after, _ := os.ReadFile(fx.Path); !bytes.Equal(after, orig) {
				t.Fatal("-o changed the input binary")
			}
			gotOut, enters, exits := runCounted(t, cold, preload)
			if gotOut != wantOut {
				t.Errorf("cold binary printed %q, the original %q", gotOut, wantOut)
			}
			if enters != 0 || exits != 0 {
				t.Errorf("cold binary reached the hooks %d/%d times, want 0 (%s)", enters, exits, fx.Command)
			}
			checkChangedBytes(t, orig, cold, res.List)
		})
	}
}

// checkChangedBytes asserts that the cold file differs from orig in exactly
// the bytes where each probe's active and inert forms differ.
func checkChangedBytes(t *testing.T, orig []byte, cold string, l *probelist.List) {
	t.Helper()
	got, err := os.ReadFile(cold)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(orig) {
		t.Fatalf("cold binary is %d bytes, original %d", len(got), len(orig))
	}
	want := map[int]byte{}
	for _, p := range l.Probes {
		for i := range p.Active {
			if p.Active[i] != p.Inert[i] {
				want[int(p.Offset)+i] = p.Inert[i]
			}
		}
	}
	for off := range got {
		w, expected := want[off]
		switch {
		case expected && got[off] != w:
			t.Errorf("offset %#x: %#02x, want %#02x", off, got[off], w)
		case !expected && got[off] != orig[off]:
			t.Errorf("offset %#x changed from %#02x to %#02x but belongs to no probe", off, orig[off], got[off])
		}
	}
}

func TestIdempotent(t *testing.T) {
	for _, spec := range []testutil.Spec{
		{Compiler: "gcc", Sources: []string{"basic.c"}},
		{Compiler: "clang", Sources: []string{"basic.c"}, NoPLT: true},
		{Compiler: "gcc", Sources: []string{"lib.c"}, Shared: true},
	} {
		t.Run(spec.String(), func(t *testing.T) {
			fx := testutil.Build(t, spec)
			first, err := Run(fx.Path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			st1, _ := os.Stat(fx.Path)
			cold, _ := os.ReadFile(fx.Path)
			second, err := Run(fx.Path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if second.Patched != 0 || second.Written {
				t.Errorf("second run patched %d sites, wrote %v; want nothing", second.Patched, second.Written)
			}
			st2, _ := os.Stat(fx.Path)
			again, _ := os.ReadFile(fx.Path)
			if !bytes.Equal(cold, again) || !st1.ModTime().Equal(st2.ModTime()) {
				t.Error("second run changed the file")
			}
			var a, b bytes.Buffer
			first.List.Write(&a)
			second.List.Write(&b)
			if !bytes.Equal(a.Bytes(), b.Bytes()) {
				t.Errorf("second run's probe list differs:\n%s\n---\n%s", a.Bytes(), b.Bytes())
			}
		})
	}
}

func TestInPlaceKeepsMode(t *testing.T) {
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}})
	if err := os.Chmod(fx.Path, 0o750); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(fx.Path, Options{}); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(fx.Path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o750 {
		t.Errorf("mode is %v after an in-place rewrite, want 0750", st.Mode().Perm())
	}
	entries, _ := os.ReadDir(filepath.Dir(fx.Path))
	if len(entries) != 1 {
		t.Errorf("files left beside the binary: %v", entries)
	}
}

func TestNopPlaceholder(t *testing.T) {
	lib := hooksLib(t)
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}, NoPLT: true})
	wantOut, _, _ := runCounted(t, fx.Path, lib)
	res, err := Run(fx.Path, Options{Placeholder: probelist.PlaceholderNop})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range res.List.Probes {
		if p.Placeholder != probelist.PlaceholderNop {
			t.Errorf("probe %d: placeholder %s, want nop", p.ID, p.Placeholder)
		}
		if p.Encoding == probelist.EncCallGOT && !bytes.Equal(p.Inert, []byte{0x66, 0x0f, 0x1f, 0x44, 0, 0}) {
			t.Errorf("probe %d: inert %s, want a 6-byte NOP", p.ID, p.Inert)
		}
	}
	gotOut, enters, exits := runCounted(t, fx.Path, lib)
	if gotOut != wantOut || enters != 0 || exits != 0 {
		t.Errorf("nop-cold binary printed %q with %d/%d hook calls; want %q and none", gotOut, enters, exits, wantOut)
	}
}

// TestErrors checks that bad input fails with the right sentinel and leaves
// the file and its directory exactly as they were.
func TestErrors(t *testing.T) {
	real := testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}})
	plain := testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}, NoInstr: true})
	realBytes, _ := os.ReadFile(real.Path)
	patch := func(off int, b ...byte) []byte {
		out := append([]byte(nil), realBytes...)
		copy(out[off:], b)
		return out
	}
	var machineOff = 18 // e_machine in the ELF header
	cases := []struct {
		name    string
		content []byte
		want    error
	}{
		{"not ELF", []byte("#!/bin/sh\necho hi\n"), elfscan.ErrNotELF},
		{"empty", nil, elfscan.ErrNotELF},
		{"aarch64", patch(machineOff, byte(elf.EM_AARCH64), 0), elfscan.ErrNotX86_64},
		{"32-bit", patch(4, byte(elf.ELFCLASS32)), elfscan.ErrNotX86_64},
		{"truncated", realBytes[:len(realBytes)/3], elfscan.ErrTruncated},
		{"no hooks", mustRead(t, plain.Path), elfscan.ErrNoHookSites},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "bin")
			if err := os.WriteFile(p, c.content, 0o755); err != nil {
				t.Fatal(err)
			}
			old := time.Now().Add(-time.Hour)
			os.Chtimes(p, old, old)
			_, err := Run(p, Options{})
			if !errors.Is(err, c.want) {
				t.Fatalf("Run = %v, want %v", err, c.want)
			}
			if bytes.ContainsRune([]byte(err.Error()), '\n') {
				t.Errorf("error spans lines: %q", err)
			}
			after, _ := os.ReadFile(p)
			st, _ := os.Stat(p)
			if !bytes.Equal(after, c.content) || !st.ModTime().Equal(old) {
				t.Error("a failed run touched the file")
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Errorf("a failed run left files behind: %v", entries)
			}
		})
	}
	if _, err := Run(filepath.Join(t.TempDir(), "missing"), Options{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	if _, err := Run(t.TempDir(), Options{}); err == nil {
		t.Error("a directory was accepted")
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
