package capture

import (
	"errors"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
	"github.com/edgeprobe/edgeprobe/internal/dwarfargs"
	"github.com/edgeprobe/edgeprobe/internal/elfsafe"
	"github.com/edgeprobe/edgeprobe/internal/hotpatch"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/procmaps"
	"github.com/edgeprobe/edgeprobe/internal/shm"
)

// ErrArgs means a capture cannot record the arguments it was asked for.
var ErrArgs = errors.New("cannot record arguments")

// CygArgsNote says what a cyg probe can record and why not its arguments.
const CygArgsNote = "a cyg probe (-finstrument-functions): the trace records which function ran and when, " +
	"not its arguments or return value: the hooks run after the prologue, with only their own two arguments " +
	"in registers, and the function's arguments are wherever the compiler put them at that point " +
	"(fentry probes, -pg -mfentry, run at the first instruction, where the calling convention fixes them; docs/tracing.md)"

// argFunc is what a capture records of one function's calls.
type argFunc struct {
	sig        *dwarfargs.Signature
	plan       dwarfargs.Plan
	args, rets bool
}

// spec packs f's plan for the runtime.
func (f *argFunc) spec() uint64 {
	p := f.plan
	s := shm.PlanSpec(p.IntRegs, p.SSERegs, p.StringRegs, p.StackBytes, p.RetInt, p.RetSSE)
	if p.RetString {
		s |= shm.PlanRStr
	}
	if f.args {
		s |= shm.PlanEntry
	}
	if f.rets {
		s |= shm.PlanExit
	}
	return s
}

// planArgs finds, among the enabled sites, the fentry functions whose
// arguments (argPats) or return values (retPats) the capture records, and
// their signatures from DWARF. Keys are run-time function addresses, as the
// runtime keys fentry functions. Notes say what was matched but cannot be
// recorded (cyg probes).
func planArgs(pid int, targets []*hotpatch.Target, sites []hotpatch.SiteResult, argPats, retPats []string) (map[uint64]*argFunc, []string, error) {
	for _, p := range append(append([]string(nil), argPats...), retPats...) {
		if _, err := path.Match(p, ""); err != nil {
			return nil, nil, fmt.Errorf("--args/--retval %q: bad glob: %v", p, err)
		}
	}
	matches := func(pats []string, name string) bool {
		for _, p := range pats {
			if ok, _ := path.Match(p, name); ok {
				return true
			}
		}
		return false
	}
	objs := map[string]*procmaps.Object{}
	for _, t := range targets {
		objs[t.Object.Path] = t.Object
	}
	tables := map[string]*dwarfargs.Table{}
	table := func(o *procmaps.Object) (*dwarfargs.Table, error) {
		if t, ok := tables[o.Path]; ok {
			return t, nil
		}
		f, err := procmaps.Open(pid, o)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		ef, err := elfsafe.NewFile(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o.Path, err)
		}
		t, err := dwarfargs.Load(ef)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o.Path, err)
		}
		tables[o.Path] = t
		return t, nil
	}
	funcs := map[uint64]*argFunc{}
	cyg := map[string]bool{}
	var noDWARF []string
	for _, s := range sites {
		a, r := matches(argPats, s.Function), matches(retPats, s.Function)
		if !a && !r {
			continue
		}
		if s.Provider != probelist.ProviderFentry {
			cyg[s.Function] = true
			continue
		}
		o := objs[s.Object]
		addr, err := strconv.ParseUint(strings.TrimPrefix(s.Address, "0x"), 16, 64)
		if o == nil || err != nil {
			return nil, nil, fmt.Errorf("site %s of %s: no mapped object: %w", s.Address, s.Function, ErrArgs)
		}
		t, err := table(o)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: reading DWARF for --args: %v: %w", s.Function, err, ErrArgs)
		}
		// The site is the __fentry__ call: the function's first
		// instruction, or the one after endbr64.
		var sig *dwarfargs.Signature
		for _, back := range []uint64{0, 4} {
			if sig, err = t.Lookup(addr - o.Bias - back); err == nil {
				break
			}
		}
		if sig == nil {
			noDWARF = append(noDWARF, s.Function)
			continue
		}
		key := o.Runtime(sig.Addr)
		f := funcs[key]
		if f == nil {
			f = &argFunc{sig: sig, plan: sig.Plan()}
			funcs[key] = f
		}
		f.args, f.rets = f.args || a, f.rets || r
	}
	var notes []string
	if n := seccompThreads(pid); n > 0 {
		// A filter may forbid process_vm_readv, and its action may be to kill
		// the process: strings are not copied, their pointers are shown.
		dropStrings(funcs)
		notes = append(notes, fmt.Sprintf("%d threads of the process run under a seccomp filter, which may forbid the call that copies strings without faulting (process_vm_readv) and kill the process for it: char * values are shown as pointers", n))
	}
	for _, name := range sortedKeys(cyg) {
		notes = append(notes, name+": "+CygArgsNote)
	}
	for _, name := range noDWARF {
		notes = append(notes, name+": no DWARF describes this function (build with -g): its arguments are not recorded")
	}
	if len(funcs) == 0 {
		return nil, notes, fmt.Errorf("--args/--retval matched no fentry function with DWARF%s: %w", joinNotes(notes), ErrArgs)
	}
	if len(funcs) > shm.ArgPlans {
		return nil, notes, fmt.Errorf("--args/--retval matched %d functions; a capture records the arguments of at most %d: %w", len(funcs), shm.ArgPlans, ErrArgs)
	}
	return funcs, notes, nil
}

// copiesStrings reports whether any plan copies a string.
func copiesStrings(funcs map[uint64]*argFunc) bool {
	for _, f := range funcs {
		if f.plan.StringRegs != 0 || f.plan.RetString {
			return true
		}
	}
	return false
}

// dropStrings plans no string copies: char * values are shown as pointers.
func dropStrings(funcs map[uint64]*argFunc) {
	for _, f := range funcs {
		f.plan.StringRegs, f.plan.RetString = 0, false
	}
}

// lateSeccompNote says why strings stopped being copied during a capture.
const lateSeccompNote = "a thread of the process entered a seccomp filter during the capture, which may forbid the call that copies strings without faulting (process_vm_readv) and kill the process for it: char * values after that are shown as pointers"

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func joinNotes(notes []string) string {
	if len(notes) == 0 {
		return ""
	}
	return " (" + strings.Join(notes, "; ") + ")"
}

// Why an argument or return value of a planned function has no record.
const (
	noArgRecord = "not recorded: the trace ring had no room for the arguments (a bigger --ring-events keeps them)"
	// No events were lost after the enter: the ring had room, something
	// else kept the runtime from writing the record after the enter (or
	// the capture ended between the two).
	noArgMissing = "not recorded: no record followed the call's entry (the ring lost nothing there)"
	noRetRecord  = "not recorded: the trace ring had no room for the return value, or the call left by a tail call"
	badRecord    = "not recorded: the runtime copied less than the plan asks for"
)

// entryRegs unpacks an args record (layout in runtime/edgeprobe_shm.h).
func entryRegs(spec uint64, d []uint64) (*dwarfargs.EntryRegs, bool) {
	r := &dwarfargs.EntryRegs{}
	i := 0
	next := func() (uint64, bool) {
		if i >= len(d) {
			return 0, false
		}
		i++
		return d[i-1], true
	}
	var ok bool
	for reg := 0; reg < 6; reg++ {
		if shm.SpecInt(spec)&(1<<reg) != 0 {
			if r.Int[reg], ok = next(); !ok {
				return nil, false
			}
		}
	}
	for reg := 0; reg < 8; reg++ {
		if shm.SpecSSE(spec)&(1<<reg) != 0 {
			if r.SSE[reg], ok = next(); !ok {
				return nil, false
			}
		}
	}
	stack := shm.SpecStack(spec)
	for w := 0; w < (stack+7)/8; w++ {
		v, ok := next()
		if !ok {
			return nil, false
		}
		r.Stack = append(r.Stack, le64(v)...)
	}
	r.Stack = r.Stack[:stack]
	for reg := 0; reg < 6; reg++ {
		if shm.SpecStr(spec)&(1<<reg) != 0 {
			s, n, ok := cstring(d[i:])
			if !ok {
				return nil, false
			}
			r.Str[reg], i = s, i+n
		}
	}
	return r, true
}

// exitRegs unpacks a return-value record.
func exitRegs(spec uint64, d []uint64) (*dwarfargs.ExitRegs, bool) {
	r := &dwarfargs.ExitRegs{}
	i := 0
	for reg := 0; reg < 2; reg++ {
		if shm.SpecRInt(spec)&(1<<reg) != 0 {
			if i >= len(d) {
				return nil, false
			}
			r.Int[reg], i = d[i], i+1
		}
	}
	for reg := 0; reg < 2; reg++ {
		if shm.SpecRSSE(spec)&(1<<reg) != 0 {
			if i >= len(d) {
				return nil, false
			}
			r.SSE[reg], i = d[i], i+1
		}
	}
	if spec&shm.PlanRStr != 0 {
		s, _, ok := cstring(d[i:])
		if !ok {
			return nil, false
		}
		r.Str = s
	}
	return r, true
}

// cstring unpacks a string's status word and bytes; n is the words used.
func cstring(d []uint64) (s *dwarfargs.CString, n int, ok bool) {
	if len(d) == 0 {
		return nil, 0, false
	}
	st := d[0]
	l := int(st & 0xff)
	words := (l + 7) / 8
	if l > shm.StrMax || len(d) < 1+words {
		return nil, 0, false
	}
	s = &dwarfargs.CString{Complete: st&shm.StrComplete != 0, Fault: st&shm.StrFault != 0}
	for _, w := range d[1 : 1+words] {
		s.Bytes = append(s.Bytes, le64(w)...)
	}
	s.Bytes = s.Bytes[:l]
	return s, 1 + words, true
}

func le64(v uint64) []byte {
	return []byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24), byte(v >> 32), byte(v >> 40), byte(v >> 48), byte(v >> 56)}
}

// covers reports whether a record made with spec holds every value plan
// asks for (a record made while plans changed may hold less). A string
// the plan asks for may be absent: the runtime stops copying strings the
// moment the program asks for seccomp (runtime/edgeprobe_seccomp.c), before
// the capture drops them from its plans, and the decoder then shows that
// char * as the bare pointer it recorded.
func covers(spec uint64, p dwarfargs.Plan, entry bool) bool {
	if entry {
		return shm.SpecInt(spec)&p.IntRegs == p.IntRegs && shm.SpecSSE(spec)&p.SSERegs == p.SSERegs &&
			shm.SpecStack(spec) >= min(p.StackBytes, shm.StackMax)
	}
	return shm.SpecRInt(spec)&p.RetInt == p.RetInt && shm.SpecRSSE(spec)&p.RetSSE == p.RetSSE
}

// missingArgs marks every argument of f not recorded, with why.
func missingArgs(f *argFunc, why string) []calltrace.Value {
	out := make([]calltrace.Value, 0, len(f.sig.Params))
	for _, p := range f.sig.Params {
		out = append(out, calltrace.Value{Name: p.Name, Type: p.Type.Name, Kind: calltrace.Missing, Note: why})
	}
	return out
}

// missingRet is f's return value not recorded, nil for a void function.
func missingRet(f *argFunc, why string) *calltrace.Value {
	t := f.sig.Ret.Type
	if t == nil || t.Kind == dwarfargs.KVoid {
		return nil
	}
	return &calltrace.Value{Type: t.Name, Kind: calltrace.Missing, Note: why}
}

// probeSites lists, as sites, every probe of the targets whose function one
// of pats names (globs; checked by planArgs), on or off.
func probeSites(targets []*hotpatch.Target, pats []string) []hotpatch.SiteResult {
	var out []hotpatch.SiteResult
	for _, t := range targets {
		for i := 0; i < t.List.Len(); i++ {
			p, err := t.Probe(i)
			if err != nil {
				continue // not in the process's mappings: no hook can run there
			}
			match := false
			for _, pat := range pats {
				if ok, _ := path.Match(pat, p.Function); ok {
					match = true
				}
			}
			if match {
				out = append(out, hotpatch.SiteResult{Object: t.Object.Path, Function: p.Function, Provider: p.Provider,
					Address: "0x" + strconv.FormatUint(t.Object.Runtime(uint64(p.Address)), 16)})
			}
		}
	}
	return out
}

// seccompThreads counts the threads of pid under seccomp (unknown: 1).
func seccompThreads(pid int) int { return procfs.SeccompThreads(pid) }
