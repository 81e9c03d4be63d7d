package x86dec

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/arch/x86/x86asm"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// objdumpInsts returns objdump's instruction boundaries in the .text of
// path, mapped to the mnemonic, as an oracle independent of x86asm.
func objdumpInsts(t *testing.T, path string) map[uint64]string {
	t.Helper()
	testutil.RequireTool(t, "objdump")
	out, err := exec.Command("objdump", "-d", "-w", "-j", ".text", "--no-show-raw-insn", path).Output()
	if err != nil {
		t.Fatalf("objdump %s: %v", path, err)
	}
	insts := map[uint64]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		addr, rest, ok := strings.Cut(line, ":\t")
		if !ok || !strings.HasPrefix(addr, " ") {
			continue
		}
		a, err := strconv.ParseUint(strings.TrimSpace(addr), 16, 64)
		if err != nil {
			continue
		}
		insts[a] = strings.Fields(rest + " ?")[0]
	}
	return insts
}

type function struct {
	name string
	addr uint64
	code []byte
}

func textFunctions(t *testing.T, path string) []function {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	text := f.Section(".text")
	data, err := text.Data()
	if err != nil {
		t.Fatal(err)
	}
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	var fns []function
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Size == 0 || int(s.Section) >= len(f.Sections) || f.Sections[s.Section] != text {
			continue
		}
		off := s.Value - text.Addr
		fns = append(fns, function{s.Name, s.Value, data[off : off+s.Size]})
	}
	if len(fns) == 0 {
		t.Fatalf("%s: no functions in .text", path)
	}
	return fns
}

// TestLinearDecodeMatchesObjdump decodes every function of compiled AVX and
// CET code linearly and requires objdump's instruction boundaries: without
// the endbr64 and vzeroupper guards the sweep desynchronises at the first
// function entry or vzeroupper.
func TestLinearDecodeMatchesObjdump(t *testing.T) {
	for _, cc := range []string{"gcc", "clang"} {
		fx := testutil.Build(t, testutil.Spec{Compiler: cc, Sources: []string{"avx.c"}, Flags: []string{"-mavx", "-fcf-protection"}})
		want := objdumpInsts(t, fx.Path)
		seen := map[string]int{}
		for _, fn := range textFunctions(t, fx.Path) {
			for pc := 0; pc < len(fn.code); {
				addr := fn.addr + uint64(pc)
				in, err := Decode(fn.code[pc:])
				if err != nil {
					t.Fatalf("%s: %s+%#x: %v (objdump: %s)\n%s", cc, fn.name, pc, err, want[addr], fx.Command)
				}
				mnem, ok := want[addr]
				if !ok {
					t.Fatalf("%s: %s+%#x: decoded %q at an address that is not an instruction boundary for objdump\n%s", cc, fn.name, pc, in, fx.Command)
				}
				if mnem == "endbr64" || strings.HasPrefix(mnem, "vzero") {
					if got := strings.Fields(in.String())[0]; got != mnem {
						t.Errorf("%s: %#x: decoded %q, objdump says %s", cc, addr, in, mnem)
					}
				}
				seen[mnem]++
				pc += in.Len
				if next := fn.addr + uint64(pc); pc < len(fn.code) {
					if _, ok := want[next]; !ok {
						t.Fatalf("%s: %s+%#x: %q has length %d, which ends inside an objdump instruction\n%s", cc, fn.name, pc-in.Len, in, in.Len, fx.Command)
					}
				}
			}
		}
		if seen["endbr64"] == 0 || seen["vzeroupper"] == 0 {
			t.Fatalf("%s: fixture lacks the instructions under test (endbr64: %d, vzeroupper: %d)\n%s", cc, seen["endbr64"], seen["vzeroupper"], fx.Command)
		}
	}
}

// TestGuardedForms decodes the assembled decode.S: each guarded form must
// have its true length, and rdsspq, which x86asm returns as a bare REP
// prefix, must be an error.
func TestGuardedForms(t *testing.T) {
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"decode.S"}, Flags: []string{"-c"}, Name: "decode.o"})
	fns := textFunctions(t, fx.Path)
	code := fns[0].code
	want := []struct {
		at   int
		len  int
		kind Kind
		op   x86asm.Op
		text string
	}{
		{0x00, 4, KindEndbr64, 0, "endbr64"},
		{0x06, 4, KindEndbr32, 0, "endbr32"},
		{0x0b, 3, KindX86asm, x86asm.VZEROUPPER, "vzeroupper"},
		{0x10, 3, KindX86asm, x86asm.VZEROALL, "vzeroall"},
		{0x14, 4, KindX86asm, x86asm.VZEROUPPER, "vzeroupper"},
		{0x1a, 4, KindX86asm, x86asm.VZEROALL, "vzeroall"},
	}
	for _, w := range want {
		in, err := Decode(code[w.at:])
		if err != nil {
			t.Errorf("%#x (%s): %v", w.at, w.text, err)
			continue
		}
		if in.Len != w.len || in.Kind != w.kind || in.Op != w.op || in.String() != w.text {
			t.Errorf("%#x: got %q len %d kind %d op %v, want %q len %d kind %d op %v", w.at, in, in.Len, in.Kind, in.Op, w.text, w.len, w.kind, w.op)
		}
		// The instruction after each guarded form is a real jmp or ret.
		next, err := Decode(code[w.at+in.Len:])
		if err != nil || (next.Op != x86asm.JMP && next.Op != x86asm.RET) {
			t.Errorf("%#x: instruction after %s decodes as %q, %v; want jmp or ret", w.at, w.text, next, err)
		}
	}
	if in, err := Decode(code[0x1f:]); !errors.Is(err, ErrUndecodable) {
		t.Errorf("rdsspq: got %q len %d, %v; want ErrUndecodable", in, in.Len, err)
	}
	// vzeroall is the last instruction of the section: exactly 3 bytes left.
	tail := code[len(code)-3:]
	if in, err := Decode(tail); err != nil || in.Len != 3 || in.Op != x86asm.VZEROALL {
		t.Errorf("vzeroall at the end of the section: got %q len %d, %v", in, in.Len, err)
	}
}

// TestInvalidVZero covers the VEX 0f 77 encodings that are #UD (vvvv not
// 1111b, or a pp prefix), which the wrapper must refuse rather than size.
func TestInvalidVZero(t *testing.T) {
	for _, b := range [][]byte{
		{0xc5, 0xb8, 0x77, 0x90, 0x90, 0x90, 0x90}, // vvvv=0111
		{0xc5, 0xf9, 0x77, 0x90, 0x90, 0x90, 0x90}, // pp=01
		{0xc4, 0xe1, 0x79, 0x77, 0x90, 0x90, 0x90}, // pp=01
	} {
		if in, err := Decode(b); !errors.Is(err, ErrUndecodable) {
			t.Errorf("% x: got %q len %d, %v; want ErrUndecodable", b, in, in.Len, err)
		}
	}
	// A segment prefix before the VEX prefix is legal and counts in the length.
	if in, err := Decode([]byte{0x2e, 0xc5, 0xf8, 0x77, 0xc3, 0x90, 0x90}); err != nil || in.Len != 4 || in.Op != x86asm.VZEROUPPER {
		t.Errorf("2e c5 f8 77: got %q len %d, %v", in, in.Len, err)
	}
}

// FuzzDecode checks that Decode never panics and never returns a length
// outside the input or the architectural 15-byte limit.
func FuzzDecode(f *testing.F) {
	f.Add([]byte{0xf3, 0x0f, 0x1e, 0xfa})
	f.Add([]byte{0xc5, 0xf8, 0x77, 0xe9, 1, 2, 3, 4})
	f.Add([]byte{0x2e, 0xc4, 0xe1, 0x7c, 0x77})
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := Decode(b)
		if err == nil && (in.Len <= 0 || in.Len > len(b) || in.Len > 15) {
			t.Fatalf("% x: length %d", b, in.Len)
		}
	})
}
