package elfscan

import (
	"strings"

	"golang.org/x/arch/x86/x86asm"

	"github.com/edgeprobe/edgeprobe/internal/x86dec"
)

// Instruction classification. The tables are deliberately conservative in
// the direction that keeps patching safe: an instruction not known to leave a
// register alone ends a backward walk, and the list of flag readers is
// complete (every x86-64 instruction that reads a status flag is in it).

func isJmp(in x86dec.Inst) bool  { return in.Kind == x86dec.KindX86asm && in.Op == x86asm.JMP }
func isCall(in x86dec.Inst) bool { return in.Kind == x86dec.KindX86asm && in.Op == x86asm.CALL }

// relTarget returns the destination of a relative branch.
func relTarget(in x86dec.Inst, addr uint64) (uint64, bool) {
	if in.Kind != x86dec.KindX86asm {
		return 0, false
	}
	if r, ok := in.Args[0].(x86asm.Rel); ok {
		return addr + uint64(in.Len) + uint64(int64(r)), true
	}
	return 0, false
}

// ripTarget returns the address of a [rip+disp] operand, if in has one.
func ripTarget(in x86dec.Inst, addr uint64) (uint64, bool) {
	if in.Kind != x86dec.KindX86asm {
		return 0, false
	}
	for _, a := range in.Args {
		if a == nil {
			break
		}
		if m, ok := a.(x86asm.Mem); ok && m.Base == x86asm.RIP && m.Index == 0 {
			return addr + uint64(in.Len) + uint64(int64(int32(m.Disp))), true
		}
	}
	return 0, false
}

// isBranch reports whether in is a conditional or unconditional relative
// branch other than call.
func isBranch(in x86dec.Inst) bool {
	if in.Kind != x86dec.KindX86asm {
		return false
	}
	if _, ok := in.Args[0].(x86asm.Rel); !ok {
		return false
	}
	return in.Op != x86asm.CALL
}

// noFallthrough reports whether execution never continues at the next
// instruction.
func noFallthrough(in x86dec.Inst) bool {
	if in.Kind != x86dec.KindX86asm {
		return false
	}
	switch in.Op {
	case x86asm.JMP, x86asm.RET, x86asm.UD2, x86asm.HLT, x86asm.LRET, x86asm.IRET, x86asm.IRETD, x86asm.IRETQ:
		return true
	}
	return false
}

// isPadding reports whether in is a no-op of the kind assemblers emit for
// alignment. Alignment padding precedes the label it aligns, so no branch
// lands on it.
func isPadding(in x86dec.Inst) bool {
	if in.Kind != x86dec.KindX86asm {
		return false
	}
	if in.Op == x86asm.NOP {
		return true
	}
	a, _ := in.Args[0].(x86asm.Reg)
	b, _ := in.Args[1].(x86asm.Reg)
	return in.Op == x86asm.XCHG && a != 0 && a == b
}

var flagReaders = map[string]bool{
	"ADC": true, "SBB": true, "ADCX": true, "ADOX": true, "RCL": true, "RCR": true,
	"PUSHF": true, "PUSHFD": true, "PUSHFQ": true, "LAHF": true, "CMC": true, "INTO": true,
	"SALC": true, "LOOPE": true, "LOOPNE": true,
}

// readsFlags reports whether in reads a status flag.
func readsFlags(in x86dec.Inst) bool {
	if in.Kind != x86dec.KindX86asm {
		return false
	}
	name := in.Op.String()
	switch {
	case flagReaders[name]:
		return true
	case strings.HasPrefix(name, "J"):
		return in.Op != x86asm.JMP && in.Op != x86asm.JCXZ && in.Op != x86asm.JECXZ && in.Op != x86asm.JRCXZ
	case strings.HasPrefix(name, "SET"), strings.HasPrefix(name, "CMOV"), strings.HasPrefix(name, "FCMOV"):
		return true
	case isStringCompare(in.Op):
		// With a REP prefix the comparison may run zero times and leave
		// the incoming flags in place.
		return hasRep(in)
	}
	return false
}

func isStringCompare(op x86asm.Op) bool {
	switch op {
	case x86asm.CMPSB, x86asm.CMPSW, x86asm.CMPSD, x86asm.CMPSQ, x86asm.SCASB, x86asm.SCASW, x86asm.SCASD, x86asm.SCASQ:
		return true
	}
	return false
}

func hasRep(in x86dec.Inst) bool {
	for _, p := range in.Prefix {
		if p == 0 {
			break
		}
		if p&0xff == x86asm.PrefixREP&0xff || p&0xff == x86asm.PrefixREPN&0xff {
			return true
		}
	}
	return false
}

// flagWriters leave every status flag (CF, PF, AF, ZF, SF, OF) defined by
// the result or undefined; either way no compiler reads the old value after
// them.
var flagWriters = map[string]bool{
	"ADD": true, "SUB": true, "CMP": true, "TEST": true, "AND": true, "OR": true, "XOR": true,
	"NEG": true, "CMPXCHG": true, "XADD": true, "IMUL": true, "MUL": true, "DIV": true, "IDIV": true,
	"BSF": true, "BSR": true, "POPCNT": true, "LZCNT": true, "TZCNT": true,
	"ANDN": true, "BEXTR": true, "BLSI": true, "BLSMSK": true, "BLSR": true, "BZHI": true,
	"COMISS": true, "COMISD": true, "UCOMISS": true, "UCOMISD": true,
	"VCOMISS": true, "VCOMISD": true, "VUCOMISS": true, "VUCOMISD": true,
	"PTEST": true, "VPTEST": true, "VTESTPS": true, "VTESTPD": true,
	"POPF": true, "POPFQ": true, "RDRAND": true, "RDSEED": true,
}

// writesAllFlags reports whether in overwrites every status flag.
func writesAllFlags(in x86dec.Inst) bool {
	if in.Kind != x86dec.KindX86asm {
		return false
	}
	if isStringCompare(in.Op) {
		return !hasRep(in)
	}
	switch in.Op {
	case x86asm.SHL, x86asm.SHR, x86asm.SAR:
		// A zero count leaves the flags alone; only a constant non-zero
		// count is known to write them.
		if imm, ok := in.Args[1].(x86asm.Imm); ok {
			mask := x86asm.Imm(31)
			if in.DataSize == 64 {
				mask = 63
			}
			return imm&mask != 0
		}
		return false
	}
	return flagWriters[in.Op.String()]
}

// Register families: every width of one general-purpose register.
const noFamily = -1

func family(r x86asm.Reg) int {
	switch {
	case r >= x86asm.AL && r <= x86asm.BL:
		return int(r - x86asm.AL)
	case r >= x86asm.AH && r <= x86asm.BH:
		return int(r - x86asm.AH)
	case r >= x86asm.SPB && r <= x86asm.R15B:
		return int(r-x86asm.SPB) + 4
	case r >= x86asm.AX && r <= x86asm.R15W:
		return int(r - x86asm.AX)
	case r >= x86asm.EAX && r <= x86asm.R15L:
		return int(r - x86asm.EAX)
	case r >= x86asm.RAX && r <= x86asm.R15:
		return int(r - x86asm.RAX)
	}
	return noFamily
}

// Family numbers follow the x86asm (and hardware) register order.
const (
	famRAX = iota
	famRCX
	famRDX
	famRBX
	famRSP
	famRBP
	famRSI
	famRDI
	famR8
)

// calleeSaved reports whether the SysV ABI makes a call preserve the register.
func calleeSaved(fam int) bool {
	switch fam {
	case famRBX, famRSP, famRBP, famR8 + 4, famR8 + 5, famR8 + 6, famR8 + 7:
		return true
	}
	return false
}

// implicitWrites returns the register families (bit n for family n) that in
// writes without naming them as its first operand; a backward walk cannot
// pass such a write.
func implicitWrites(in x86dec.Inst) uint32 {
	const (
		ax, cx, dx, bx = 1 << famRAX, 1 << famRCX, 1 << famRDX, 1 << famRBX
		sp, bp, si, di = 1 << famRSP, 1 << famRBP, 1 << famRSI, 1 << famRDI
		r11, all       = 1 << (famR8 + 3), 0xffff
	)
	switch in.Op {
	case x86asm.MUL, x86asm.DIV, x86asm.IDIV, x86asm.CWD, x86asm.CDQ, x86asm.CQO,
		x86asm.RDTSC, x86asm.RDMSR, x86asm.RDPMC, x86asm.XGETBV, x86asm.CMPXCHG8B, x86asm.CMPXCHG16B:
		return ax | dx
	case x86asm.IMUL:
		if in.Args[1] == nil {
			return ax | dx
		}
	case x86asm.CBW, x86asm.CWDE, x86asm.CDQE, x86asm.LAHF, x86asm.XLATB, x86asm.IN, x86asm.CMPXCHG:
		return ax
	case x86asm.RDTSCP:
		return ax | dx | cx
	case x86asm.CPUID:
		return ax | bx | cx | dx
	case x86asm.LODSB, x86asm.LODSW, x86asm.LODSD, x86asm.LODSQ:
		return ax | si | cx
	case x86asm.STOSB, x86asm.STOSW, x86asm.STOSD, x86asm.STOSQ, x86asm.SCASB, x86asm.SCASW, x86asm.SCASD, x86asm.SCASQ,
		x86asm.INSB, x86asm.INSW, x86asm.INSD:
		return di | cx
	case x86asm.MOVSB, x86asm.MOVSW, x86asm.MOVSD, x86asm.MOVSQ, x86asm.CMPSB, x86asm.CMPSW, x86asm.CMPSD, x86asm.CMPSQ:
		return si | di | cx
	case x86asm.OUTSB, x86asm.OUTSW, x86asm.OUTSD:
		return si | cx
	case x86asm.SYSCALL:
		return ax | cx | r11
	case x86asm.LOOP, x86asm.LOOPE, x86asm.LOOPNE, x86asm.PCMPESTRI, x86asm.PCMPISTRI:
		return cx
	case x86asm.LEAVE, x86asm.ENTER:
		return sp | bp
	case x86asm.PUSH, x86asm.POP, x86asm.CALL, x86asm.RET:
		return sp
	case x86asm.XCHG, x86asm.XADD:
		var m uint32
		for _, a := range in.Args[:2] {
			if r, ok := a.(x86asm.Reg); ok && family(r) != noFamily {
				m |= 1 << family(r)
			}
		}
		return m
	case x86asm.SYSENTER, x86asm.INT:
		return all
	}
	switch in.Op.String() {
	case "MULX", "VPCMPESTRI", "VPCMPISTRI", "RDPKRU":
		return all
	}
	return 0
}

// readOnlyFirst are instructions whose first operand is only read.
var readOnlyFirst = map[x86asm.Op]bool{
	x86asm.CMP: true, x86asm.TEST: true, x86asm.PUSH: true, x86asm.BT: true,
	x86asm.CALL: true, x86asm.JMP: true,
}

// mayWrite reports whether in may change register family fam.
func mayWrite(in x86dec.Inst, fam int) bool {
	if in.Kind != x86dec.KindX86asm {
		return false // endbr
	}
	if implicitWrites(in)&(1<<fam) != 0 {
		return true
	}
	if r, ok := in.Args[0].(x86asm.Reg); ok && family(r) == fam {
		return !readOnlyFirst[in.Op]
	}
	return false
}
