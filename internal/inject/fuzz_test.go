package inject

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/probecache"
	"github.com/edgeprobe/edgeprobe/internal/procmaps"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// FuzzParseObject: a mapped object's file is input hotpatch did not write
// (a hand-edited library, a truncated file): parsing it gives an error or
// slots inside the file's own relocations, never a panic.
func FuzzParseObject(f *testing.F) {
	for _, spec := range []testutil.Spec{
		{Sources: []string{"lib.c"}, Shared: true, Name: "libfix.so"},
		{Sources: []string{"lib.c"}, Shared: true, NoPLT: true, Name: "libfix-noplt.so"},
	} {
		if b, err := os.ReadFile(testutil.Build(f, spec).Path); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		defs, slots, interp, err := parseObject(bytes.NewReader(data), "fuzz", 0x1000)
		if err != nil {
			return
		}
		for _, s := range slots {
			if hookIndex(s.Hook) < 0 {
				t.Fatalf("slot for %q, which is not a hook", s.Hook)
			}
		}
		sameAsDebugElf(t, data, defs, slots, interp)
	})
}

// parseObjectDebugElf is parseObject as it was written on
// elf.File.DynamicSymbols: the reference the raw reader must agree with.
// ok is false where DynamicSymbols refuses the file for its symbol-version
// tables, or the file is not 64-bit little-endian: parseObject differs
// there on purpose.
func parseObjectDebugElf(r io.ReaderAt, name string, bias uint64) (defs map[string]uint64, slots []Slot, interp, ok bool) {
	ef, err := elf.NewFile(r)
	if err != nil || ef.Class != elf.ELFCLASS64 || ef.Data != elf.ELFDATA2LSB {
		return nil, nil, false, false
	}
	for _, prog := range ef.Progs {
		if prog.Type == elf.PT_INTERP {
			interp = true
		}
	}
	syms, err := ef.DynamicSymbols()
	if err != nil {
		if _, _, serr := dynsyms(ef); serr {
			return nil, nil, interp, false // refused for its version tables
		}
		return map[string]uint64{}, nil, interp, true
	}
	defs = map[string]uint64{}
	for _, s := range syms {
		if !wanted[s.Name] || s.Section == elf.SHN_UNDEF || s.Value == 0 || elf.ST_TYPE(s.Info) != elf.STT_FUNC && elf.ST_TYPE(s.Info) != elf.STT_GNU_IFUNC {
			continue
		}
		if _, ok := defs[s.Name]; !ok {
			defs[s.Name] = s.Value + bias
		}
	}
	for _, sec := range ef.Sections {
		if sec.Type != elf.SHT_RELA {
			continue
		}
		data, err := sec.Data()
		if err != nil {
			continue
		}
		for off := 0; off+24 <= len(data); off += 24 {
			info := binary.LittleEndian.Uint64(data[off+8:])
			typ := elf.R_X86_64(elf.R_TYPE64(info))
			if typ != elf.R_X86_64_JMP_SLOT && typ != elf.R_X86_64_GLOB_DAT {
				continue
			}
			si := int(elf.R_SYM64(info))
			if si == 0 || si > len(syms) {
				continue
			}
			hname := syms[si-1].Name
			if hookIndex(hname) < 0 {
				continue
			}
			kind := "JUMP_SLOT"
			if typ == elf.R_X86_64_GLOB_DAT {
				kind = "GLOB_DAT"
			}
			slots = append(slots, Slot{Object: name, Hook: hname, Reloc: kind, Addr: binary.LittleEndian.Uint64(data[off:]) + bias})
		}
	}
	return defs, slots, interp, true
}

// sameAsDebugElf fails t unless parseObject's results on data are the
// reference's (where the reference reads the file).
func sameAsDebugElf(t *testing.T, data []byte, defs map[string]uint64, slots []Slot, interp bool) {
	t.Helper()
	wdefs, wslots, winterp, ok := parseObjectDebugElf(bytes.NewReader(data), "fuzz", 0x1000)
	if !ok {
		return
	}
	if !reflect.DeepEqual(defs, wdefs) || !reflect.DeepEqual(slots, wslots) || interp != winterp {
		t.Fatalf("parseObject differs from DynamicSymbols:\n defs %v, want %v\n slots %+v, want %+v\n interp %v, want %v", defs, wdefs, slots, wslots, interp, winterp)
	}
}

// TestParseObjectLikeDebugElf: on real objects (this machine's libc, ld.so
// and programs, the runtime, instrumented fixtures), the raw reader finds
// exactly the definitions, slots and interpreter the reference finds.
func TestParseObjectLikeDebugElf(t *testing.T) {
	paths := []string{
		testutil.Build(t, testutil.Spec{Sources: []string{"lib.c"}, Shared: true, Name: "libfix.so"}).Path,
		testutil.Build(t, testutil.Spec{Sources: []string{"lib.c"}, Shared: true, NoPLT: true, Name: "libfix-noplt.so"}).Path,
		testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}}).Path,
		testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}, PIE: testutil.Bool(false)}).Path,
		testutil.Runtime(t, "gcc"),
	}
	// A PIE whose .rela.dyn (a RELATIVE entry per function pointer, 3,000
	// of them) spans several of parseObject's chunks, with its hook slots.
	var src strings.Builder
	for i := 0; i < 3000; i++ {
		fmt.Fprintf(&src, "int f%d(void) { return %d; }\n", i, i)
	}
	src.WriteString("int (*table[])(void) = {")
	for i := 0; i < 3000; i++ {
		fmt.Fprintf(&src, "f%d,", i)
	}
	src.WriteString("};\nint main(int argc, char **argv) { return table[argc](); }\n")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "many.c"), []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	many := filepath.Join(dir, "many")
	if out, err := exec.Command("gcc", "-O1", "-fPIE", "-pie", "-finstrument-functions", "-o", many, filepath.Join(dir, "many.c")).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	paths = append(paths, many)
	for _, glob := range []string{"/lib/x86_64-linux-gnu/libc.so.*", "/lib64/ld-linux-x86-64.so.*", "/lib/x86_64-linux-gnu/libstdc++.so.*", "/usr/bin/ls", "/usr/bin/gdb"} {
		m, _ := filepath.Glob(glob)
		paths = append(paths, m...)
	}
	seen := 0
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		defs, slots, interp, err := parseObject(bytes.NewReader(data), "fuzz", 0x1000)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if _, _, _, ok := parseObjectDebugElf(bytes.NewReader(data), "fuzz", 0x1000); !ok {
			t.Fatalf("%s: the reference does not read it", p)
		}
		sameAsDebugElf(t, data, defs, slots, interp)
		if strings.Contains(p, "libc.so") && len(defs) < len(libcFuncs)-3 {
			t.Fatalf("%s: only %v defined", p, defs)
		}
		if (strings.Contains(p, "libfix") || p == many) && len(slots) == 0 {
			t.Fatalf("%s: no hook slot", p)
		}
		seen++
	}
	if ef, err := elf.Open(many); err != nil || ef.Section(".rela.dyn") == nil || ef.Section(".rela.dyn").Size <= relaChunk {
		t.Fatalf("%s: no .rela.dyn of two chunks or more (%v)", many, err)
	}
	if seen < 6 {
		t.Fatalf("only %d objects read", seen)
	}
}

// TestParseObjectSlots: a -finstrument-functions library reaches its hooks
// through JUMP_SLOT (PLT) relocations, built -fno-plt through GLOB_DAT ones.
func TestParseObjectSlots(t *testing.T) {
	for _, c := range []struct {
		spec testutil.Spec
		want string
	}{
		{testutil.Spec{Sources: []string{"lib.c"}, Shared: true, Name: "libfix.so"}, "JUMP_SLOT"},
		{testutil.Spec{Sources: []string{"lib.c"}, Shared: true, NoPLT: true, Name: "libfix-noplt.so"}, "GLOB_DAT"},
	} {
		b, err := os.ReadFile(testutil.Build(t, c.spec).Path)
		if err != nil {
			t.Fatal(err)
		}
		_, slots, _, err := parseObject(bytes.NewReader(b), c.spec.Name, 0)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, s := range slots {
			got[s.Hook] = s.Reloc
		}
		for _, h := range Hooks[:2] {
			if got[h] != c.want {
				t.Errorf("%s: %s through %q, want %s (slots %+v)", c.spec.Name, h, got[h], c.want, slots)
			}
		}
	}
}

// FuzzObjectFacts: a cached entry's payload is input too (a damaged
// entry): decoding gives an error or facts that encode to the same bytes,
// never a panic.
func FuzzObjectFacts(f *testing.F) {
	f.Add((&objectFacts{}).encode())
	f.Add((&objectFacts{interp: true, defs: []factDef{{"mmap", 0x1234}, {"__cyg_profile_func_enter", 9}},
		slots: []factSlot{{hook: 1, off: 0x4000}, {hook: 3, globDat: true, off: 0x4008}}}).encode())
	f.Add([]byte{0, 1, 4, 'm', 'm', 'a', 'p'})
	f.Fuzz(func(t *testing.T, data []byte) {
		var x objectFacts
		if err := x.decode(data); err != nil {
			return
		}
		if got := x.encode(); !bytes.Equal(got, data) {
			t.Fatalf("decoded % x, encodes again as % x", data, got)
		}
	})
}

// TestReadObjectCached: for every object a live instrumented process maps
// (its executable, libc, ld.so), what Inspect reads from the probe cache
// is what it parses from the file: the first call parses and stores, the
// second is a hit with the same definitions, slots and interpreter, at
// this mapping's addresses.
func TestReadObjectCached(t *testing.T) {
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"mt.c"}})
	p := testutil.Start(t, nil, fx.Path)
	objs, err := procmaps.Objects(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	c, err := probecache.Open(filepath.Join(t.TempDir(), "cache"))
	if err != nil {
		t.Fatal(err)
	}
	slots := 0
	for i := range objs {
		o := &objs[i]
		wdefs, wslots, winterp, err := readObjectWith(nil, p.Pid, o)
		if err != nil {
			t.Fatalf("%s: %v", o.Path, err)
		}
		slots += len(wslots)
		for round := 0; round < 2; round++ {
			defs, got, interp, err := readObjectWith(c, p.Pid, o)
			if err != nil {
				t.Fatalf("%s, round %d: %v", o.Path, round, err)
			}
			if !reflect.DeepEqual(defs, wdefs) || !reflect.DeepEqual(got, wslots) || interp != winterp {
				t.Fatalf("%s, round %d: cached facts differ from the file's:\n defs %v, want %v\n slots %+v, want %+v\n interp %v, want %v",
					o.Path, round, defs, wdefs, got, wslots, interp, winterp)
			}
		}
	}
	if slots == 0 {
		t.Fatal("no hook slot in any object: the test shows nothing")
	}
	// Files this test did not just write are cached at once; fixtures just
	// built are too recent to be (probecache's racy margin) and are parsed
	// every time.
	if hits, _ := c.FactsStats(); hits == 0 {
		t.Fatalf("no cache hit over %d objects", len(objs))
	}
}
