package dwarfargs

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// FuzzSignatures: whatever an ELF file's DWARF holds, Load, Lookup, Plan
// and the decoders return errors or values, never panic or hang.
func FuzzSignatures(f *testing.F) {
	for _, cc := range []string{"gcc", "clang"} {
		if _, err := exec.LookPath(cc); err != nil {
			continue
		}
		fx := testutil.Build(f, testutil.Spec{Compiler: cc, Opt: "-O2", Sources: []string{"args.c"}, Profile: testutil.ProfileFentry, NoInstr: true})
		b, err := os.ReadFile(fx.Path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ef, err := elf.NewFile(bytes.NewReader(data))
		if err != nil {
			return
		}
		tab, err := Load(ef)
		if err != nil {
			return
		}
		regs := &EntryRegs{Stack: make([]byte, StackMax)}
		for i, a := range tab.Addrs() {
			if i == 200 {
				break
			}
			sig, err := tab.Lookup(a)
			if err != nil {
				continue
			}
			sig.Plan()
			sig.DecodeArgs(regs)
			sig.DecodeRet(&ExitRegs{})
		}
	})
}
