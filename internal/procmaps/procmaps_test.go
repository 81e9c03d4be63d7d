package procmaps_test

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/procmaps"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

func TestParse(t *testing.T) {
	text := `55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234 /tmp/a b/prog (deleted)
55d0c0a01000-55d0c0a02000 r-xp 00001000 fd:01 1234 /tmp/a b/prog (deleted)
7ffd1c000000-7ffd1c021000 rw-p 00000000 00:00 0                          [stack]
7f0000000000-7f0000001000 rw-p 00000000 00:00 0 
`
	ms, err := procmaps.Parse(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 4 {
		t.Fatalf("%d mappings", len(ms))
	}
	m := ms[1]
	if m.Start != 0x55d0c0a01000 || m.End != 0x55d0c0a02000 || !m.Exec() || m.Offset != 0x1000 ||
		m.Inode != 1234 || m.Path != "/tmp/a b/prog" || !m.Deleted {
		t.Errorf("parsed %+v", m)
	}
	if ms[2].Path != "[stack]" || ms[3].Path != "" {
		t.Errorf("parsed %+v %+v", ms[2], ms[3])
	}
	if _, err := procmaps.Parse(strings.NewReader("garbage\n")); err == nil {
		t.Error("garbage parsed")
	}
}

func TestNoProcess(t *testing.T) {
	if _, err := procmaps.Objects(1<<22 - 3); !errors.Is(err, procmaps.ErrNoProcess) {
		t.Fatalf("got %v", err)
	}
}

// run starts a stress fixture and waits for it to be ready; closing stdin
// ends it.
func run(t *testing.T, path string, env ...string) int {
	t.Helper()
	cmd := exec.Command(path, "1")
	cmd.Env = append(os.Environ(), env...)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := testutil.StartBound(cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready") {
		t.Fatalf("%s: %q %v %s", path, line, err, stderr.String())
	}
	return cmd.Process.Pid
}

// checkSymbol verifies the bias: the bytes at the run-time address of sym
// equal the bytes at its file offset.
func checkSymbol(t *testing.T, pid int, o *procmaps.Object, file, sym string) {
	t.Helper()
	ef, err := elf.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, _ := ef.Symbols()
	dyn, _ := ef.DynamicSymbols()
	for _, s := range append(syms, dyn...) {
		if s.Name != sym || s.Value == 0 {
			continue
		}
		var want []byte
		for _, p := range ef.Progs {
			if p.Type == elf.PT_LOAD && s.Value >= p.Vaddr && s.Value+16 <= p.Vaddr+p.Filesz {
				want = make([]byte, 16)
				p.ReadAt(want, int64(s.Value-p.Vaddr))
			}
		}
		addr := o.Runtime(s.Value)
		if !o.InExec(addr, 16) {
			t.Fatalf("%s at %#x (bias %#x) is outside the executable ranges %x", sym, addr, o.Bias, o.Exec)
		}
		f, err := os.Open("/proc/" + itoa(pid) + "/mem")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		got := make([]byte, 16)
		if _, err := f.ReadAt(got, int64(addr)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: memory at %#x holds % x, file holds % x (bias %#x wrong)", sym, addr, got, want, o.Bias)
		}
		return
	}
	t.Fatalf("no symbol %s in %s", sym, file)
}

func itoa(n int) string {
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

func buildID(t *testing.T, path string) string {
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	sec := ef.Section(".note.gnu.build-id")
	if sec == nil {
		return ""
	}
	data, _ := sec.Data()
	return strings.ToLower(hexs(data[16:]))
}

func hexs(b []byte) string {
	const d = "0123456789abcdef"
	var s []byte
	for _, c := range b {
		s = append(s, d[c>>4], d[c&15])
	}
	return string(s)
}

func TestMainObject(t *testing.T) {
	testutil.RequirePtrace(t)
	for _, pie := range []bool{true, false} {
		spec := testutil.Spec{Sources: []string{"stress.c"}, NoInstr: true, PIE: testutil.Bool(pie)}
		t.Run(spec.String(), func(t *testing.T) {
			fix := testutil.Build(t, spec)
			pid := run(t, fix.Path)
			o, err := procmaps.Main(pid)
			if err != nil {
				t.Fatal(err)
			}
			if o.Path != fix.Path || o.Deleted {
				t.Errorf("path %q deleted=%v, want %q", o.Path, o.Deleted, fix.Path)
			}
			wantType := elf.ET_EXEC
			if pie {
				wantType = elf.ET_DYN
			}
			if o.Type != wantType || (!pie && o.Bias != 0) || (pie && o.Bias == 0) {
				t.Errorf("type %v bias %#x", o.Type, o.Bias)
			}
			if id := buildID(t, fix.Path); id == "" || o.BuildID != id {
				t.Errorf("build-id %q, want %q", o.BuildID, id)
			}
			checkSymbol(t, pid, o, fix.Path, "stress_site1")
		})
	}
}

func TestSharedLibrary(t *testing.T) {
	testutil.RequirePtrace(t)
	lib := testutil.Build(t, testutil.Spec{Sources: []string{"lib.c"}, Shared: true, NoInstr: true, Name: "libfix.so"})
	fix := testutil.Build(t, testutil.Spec{Sources: []string{"stress.c"}, NoInstr: true})
	pid := run(t, fix.Path, "LD_PRELOAD="+lib.Path)
	o, err := procmaps.Find(pid, lib.Path)
	if err != nil {
		t.Fatal(err)
	}
	if o.Type != elf.ET_DYN || o.Bias == 0 {
		t.Errorf("type %v bias %#x", o.Type, o.Bias)
	}
	checkSymbol(t, pid, o, lib.Path, "lib_entry")
	// libc is there too, with its own bias.
	objs, err := procmaps.Objects(pid)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range objs {
		names = append(names, o.Path)
	}
	if len(objs) < 3 {
		t.Errorf("objects: %v", names)
	}
}

func TestDeletedBinary(t *testing.T) {
	testutil.RequirePtrace(t)
	fix := testutil.Build(t, testutil.Spec{Sources: []string{"stress.c"}, NoInstr: true})
	id := buildID(t, fix.Path)
	pid := run(t, fix.Path)
	keep, err := os.ReadFile(fix.Path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(fix.Path); err != nil {
		t.Fatal(err)
	}
	o, err := procmaps.Main(pid)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Deleted || o.Path != fix.Path || o.BuildID != id {
		t.Errorf("deleted=%v path=%q build-id=%q (want %q)", o.Deleted, o.Path, o.BuildID, id)
	}
	// Put a copy back at the path to check symbols; the mapped file is gone.
	if err := os.WriteFile(fix.Path+".copy", keep, 0o644); err != nil {
		t.Fatal(err)
	}
	checkSymbol(t, pid, o, fix.Path+".copy", "stress_site2")
}

// FuzzParseExec: on any input Parse accepts, ParseExec returns exactly
// Parse's executable mappings.
func FuzzParseExec(f *testing.F) {
	f.Add("55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234 /tmp/a b/prog (deleted)\n55d0c0a01000-55d0c0a02000 r-xp 00001000 fd:01 1234 /tmp/a b/prog (deleted)\n")
	f.Add("7ffd1c000000-7ffd1c021000 rw-p 00000000 00:00 0                          [stack]\n7f0000000000-7f0000001000 --xp 00000000 00:00 0 \n")
	f.Add("  1-2  r-xp 0 0:0 0\n")
	f.Add("1-2 r-x 0 0:0 0\n")
	f.Fuzz(func(t *testing.T, text string) {
		all, err := procmaps.Parse(strings.NewReader(text))
		if err != nil {
			return
		}
		var want []procmaps.Mapping
		for _, m := range all {
			if m.Exec() {
				want = append(want, m)
			}
		}
		got, err := procmaps.ParseExec(strings.NewReader(text))
		if err != nil {
			t.Fatalf("ParseExec: %v (Parse accepted it)", err)
		}
		if len(got) != len(want) {
			t.Fatalf("%d executable mappings, want %d", len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("mapping %d: %+v, want %+v", i, got[i], want[i])
			}
		}
	})
}

// TestReadExec: the executable mappings of a live process, as Read's.
func TestReadExec(t *testing.T) {
	all, err := procmaps.Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	got, err := procmaps.ReadExec(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	var want []procmaps.Mapping
	for _, m := range all {
		if m.Exec() {
			want = append(want, m)
		}
	}
	if len(want) == 0 || len(got) != len(want) {
		t.Fatalf("%d executable mappings, Read has %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("mapping %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if _, err := procmaps.ReadExec(-1); !errors.Is(err, procmaps.ErrNoProcess) {
		t.Errorf("pid -1: %v, want ErrNoProcess", err)
	}
}
