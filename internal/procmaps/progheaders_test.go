package procmaps

import (
	"bytes"
	"debug/elf"
	"os"
	"path/filepath"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// sameProgs fails t unless ProgHeaders, where it reads head, finds what
// debug/elf finds in the whole file.
func sameProgs(t *testing.T, file []byte) bool {
	t.Helper()
	head := file[:min(len(file), 4096)]
	typ, progs, ok := ProgHeaders(head)
	if !ok {
		return false
	}
	ef, err := elf.NewFile(bytes.NewReader(file))
	if err != nil {
		return true // debug/elf also checks the section headers, which ProgHeaders does not read
	}
	if typ != ef.Type || len(progs) != len(ef.Progs) {
		t.Fatalf("type %v with %d program headers, debug/elf %v with %d", typ, len(progs), ef.Type, len(ef.Progs))
	}
	for i := range progs {
		if progs[i].ProgHeader != ef.Progs[i].ProgHeader {
			t.Fatalf("program header %d: %+v, debug/elf %+v", i, progs[i].ProgHeader, ef.Progs[i].ProgHeader)
		}
	}
	return true
}

// TestProgHeadersLikeDebugElf: on real objects (this machine's libc,
// ld.so and programs, PIE and non-PIE fixtures, a shared library) the
// program-header reader finds what debug/elf finds.
func TestProgHeadersLikeDebugElf(t *testing.T) {
	paths := []string{
		testutil.Build(t, testutil.Spec{Sources: []string{"stress.c"}, NoInstr: true, PIE: testutil.Bool(true)}).Path,
		testutil.Build(t, testutil.Spec{Sources: []string{"stress.c"}, NoInstr: true, PIE: testutil.Bool(false)}).Path,
		testutil.Build(t, testutil.Spec{Sources: []string{"lib.c"}, Shared: true, NoInstr: true, Name: "libfix.so"}).Path,
	}
	for _, glob := range []string{"/lib/x86_64-linux-gnu/libc.so.*", "/lib64/ld-linux-x86-64.so.*", "/usr/bin/ls", "/proc/self/exe"} {
		m, _ := filepath.Glob(glob)
		paths = append(paths, m...)
	}
	read := 0
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if !sameProgs(t, b) {
			t.Fatalf("%s: ProgHeaders does not read it", p)
		}
		read++
	}
	if read < 5 {
		t.Fatalf("only %d objects read", read)
	}
}

// FuzzProgHeaders: a mapped file is input hotpatch did not write; where
// ProgHeaders reads one, and debug/elf does too, they agree, and nothing
// panics.
func FuzzProgHeaders(f *testing.F) {
	lib := testutil.Build(f, testutil.Spec{Sources: []string{"lib.c"}, Shared: true, NoInstr: true, Name: "libfix.so"}).Path
	for _, p := range []string{lib, "/lib64/ld-linux-x86-64.so.2"} {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		sameProgs(t, data)
	})
}
