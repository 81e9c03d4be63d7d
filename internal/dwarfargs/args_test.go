package dwarfargs

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// What args.c's header says cannot be recorded, with a word of the reason.
var (
	mustMiss = map[string]string{
		"many.a15": "beyond the 64 bytes", "many.a16": "beyond the 64 bytes",
		"vsum....": "variadic", "ldbl.=": "st0", "mkbig.=": "caller's memory",
	}
	// Compiler-dependent: an internal function's unused argument, and what
	// clang may do to an internal function's return value.
	mayMiss = map[string]string{"twice.unused": "", "twice.=": "may"}
)

// capture is one call as gdb saw it.
type capture struct {
	Fn, Kind string
	Int      []uint64
	SSE      []uint64
	Stack    string
	Str      []*struct {
		Bytes    string
		Complete bool
		Fault    bool
	}
}

type call struct{ entry, exit *capture }

// TestArgsMatchProgram builds args.c with gcc and clang at -O0 and -O2,
// reads every call's registers under gdb at the function's entry and
// return, copies from them only what Plan asks for (what the runtime will
// copy), decodes that with the function's signature, and requires the
// values the program printed for the same calls.
func TestArgsMatchProgram(t *testing.T) {
	testutil.RequireTool(t, "gdb")
	for _, cc := range []string{"gcc", "clang"} {
		for _, opt := range []string{"-O0", "-O2"} {
			spec := testutil.Spec{Compiler: cc, Opt: opt, Sources: []string{"args.c"}, Profile: testutil.ProfileFentry, NoInstr: true}
			t.Run(spec.String(), func(t *testing.T) { checkArgs(t, spec) })
		}
	}
}

func checkArgs(t *testing.T, spec testutil.Spec) {
	fx := testutil.Build(t, spec)
	tab, err := Open(fx.Path)
	if err != nil {
		t.Fatal(err)
	}
	printed := map[string][][]string{} // name -> calls -> fields
	out, err := exec.Command(fx.Path).Output()
	if err != nil {
		t.Fatalf("%s: %v", fx.Command, err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		printed[f[0]] = append(printed[f[0]], f[1:])
	}
	sigs := map[string]*Signature{} // by ELF symbol
	var syms []string
	for _, a := range tab.Addrs() {
		sig, err := tab.Lookup(a)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := printed[sig.Name]; ok && sig.Symbol != "" {
			sigs[sig.Symbol] = sig
			syms = append(syms, sig.Symbol)
		}
	}
	sort.Strings(syms)
	calls := gdbCalls(t, fx.Path, syms)
	seen := map[string]int{}
	checked := 0
	for _, c := range calls {
		sig := sigs[c.entry.Fn]
		k := seen[sig.Name]
		seen[sig.Name]++
		if k >= len(printed[sig.Name]) {
			continue // fib's inner calls: the program prints the outermost one
		}
		want := printed[sig.Name][k]
		args := sig.DecodeArgs(entryRegs(sig.Plan(), c.entry))
		if len(args) != len(want)-1 {
			t.Fatalf("%s call %d: %d arguments decoded, the program printed %d: %v vs %q", sig.Name, k, len(args), len(want)-1, args, want)
		}
		for i, a := range args {
			checked += compare(t, sig, a.Name, a, want[i])
		}
		if ret := sig.DecodeRet(exitRegs(sig.Plan(), c.exit)); ret != nil {
			checked += compare(t, sig, "=", *ret, strings.TrimPrefix(want[len(want)-1], "="))
		}
	}
	for name, calls := range printed {
		if seen[name] < len(calls) {
			t.Errorf("%s: gdb saw %d calls, the program printed %d", name, seen[name], len(calls))
		}
	}
	if checked < 60 {
		t.Errorf("only %d values compared", checked)
	}
	t.Logf("%s: %d values equal to what the program printed", spec, checked)
}

// compare checks one decoded value against the program's printed text,
// leaf by leaf; it returns the number of leaves compared.
func compare(t *testing.T, sig *Signature, name string, v calltrace.Value, text string) int {
	t.Helper()
	key := sig.Name + "." + name
	if v.Kind == calltrace.Missing {
		if why, ok := mustMiss[key]; ok {
			if !strings.Contains(v.Note, why) {
				t.Errorf("%s: not recorded because %q, want a reason mentioning %q", key, v.Note, why)
			}
			return 0
		}
		if why, ok := mayMiss[key]; ok && strings.Contains(v.Note, why) {
			t.Logf("%s: not recorded: %s", key, v.Note)
			return 0
		}
		t.Errorf("%s: not recorded (%s); the program printed %q", key, v.Note, text)
		return 0
	}
	if _, ok := mustMiss[key]; ok {
		t.Errorf("%s: recorded as %s, but it cannot be", key, v)
	}
	leaves := flatten(v)
	texts := strings.Split(text, ",")
	if len(leaves) != len(texts) {
		t.Errorf("%s: decoded %s (%d leaves), program printed %q", key, v, len(leaves), text)
		return 0
	}
	for i, l := range leaves {
		if !leafEqual(l, texts[i]) {
			t.Errorf("%s: decoded %s, program printed %q (leaf %d: %s vs %q)", key, v, text, i, l, texts[i])
		}
	}
	return len(leaves)
}

func flatten(v calltrace.Value) []calltrace.Value {
	if v.Kind != calltrace.Struct {
		return []calltrace.Value{v}
	}
	var out []calltrace.Value
	for _, f := range v.Fields {
		out = append(out, flatten(f)...)
	}
	return out
}

func leafEqual(v calltrace.Value, text string) bool {
	switch v.Kind {
	case calltrace.Int, calltrace.Char, calltrace.Enum:
		n, err := strconv.ParseInt(text, 10, 64)
		return err == nil && n == v.Int
	case calltrace.Uint, calltrace.Bool:
		n, err := strconv.ParseUint(text, 10, 64)
		return err == nil && n == v.Uint
	case calltrace.Wide:
		return v.Str == text
	case calltrace.Pointer:
		if text == "(nil)" {
			return v.Uint == 0
		}
		n, err := strconv.ParseUint(strings.TrimPrefix(text, "0x"), 16, 64)
		return err == nil && n == v.Uint
	case calltrace.String:
		if v.Uint == 0 {
			return text == "(nil)"
		}
		if v.Truncated {
			return len(v.Str) == StringMax && strings.HasPrefix(text, v.Str)
		}
		return v.Note == "" && v.Str == text
	case calltrace.Float:
		f, err := strconv.ParseFloat(text, 64)
		if v.Float32 {
			return err == nil && float32(f) == float32(v.Float)
		}
		return err == nil && f == v.Float
	}
	return false
}

// gdbCalls runs bin under gdb, breaking on syms, and returns the calls in
// the order they began, each with its return.
func gdbCalls(t *testing.T, bin string, syms []string) []call {
	t.Helper()
	outFile := filepath.Join(t.TempDir(), "capture.json")
	cmd := exec.Command("gdb", "-batch", "-nx", "-x", filepath.Join("testdata", "gdbcapture.py"), bin)
	cmd.Env = append(os.Environ(), "EP_OUT="+outFile, "EP_FUNCS="+strings.Join(syms, ","))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gdb: %v\n%s", err, out)
	}
	f, err := os.Open(outFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var calls []call
	open := map[string][]int{} // symbol -> indexes of calls awaiting their exit
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		c := &capture{}
		if err := json.Unmarshal(sc.Bytes(), c); err != nil {
			t.Fatalf("gdb capture: %v: %s", err, sc.Text())
		}
		switch c.Kind {
		case "entry":
			open[c.Fn] = append(open[c.Fn], len(calls))
			calls = append(calls, call{entry: c})
		case "exit", "unwound":
			st := open[c.Fn]
			if len(st) == 0 {
				t.Fatalf("gdb: %s returned without an entry", c.Fn)
			}
			calls[st[len(st)-1]].exit = c
			open[c.Fn] = st[:len(st)-1]
		}
	}
	for _, c := range calls {
		if c.exit == nil || c.exit.Kind != "exit" {
			t.Fatalf("gdb: %s did not return", c.entry.Fn)
		}
	}
	return calls
}

// entryRegs copies from gdb's capture only what the plan asks for.
func entryRegs(p Plan, c *capture) *EntryRegs {
	r := &EntryRegs{}
	for i := range r.Int {
		if p.IntRegs&(1<<i) != 0 {
			r.Int[i] = c.Int[i]
		}
		if p.StringRegs&(1<<i) != 0 {
			r.Str[i] = cstring(c.Str[i])
		}
	}
	for i := range r.SSE {
		if p.SSERegs&(1<<i) != 0 {
			r.SSE[i] = c.SSE[i]
		}
	}
	stack, _ := hex.DecodeString(c.Stack)
	r.Stack = stack[:min(p.StackBytes, len(stack))]
	return r
}

func exitRegs(p Plan, c *capture) *ExitRegs {
	r := &ExitRegs{}
	for i := 0; i < 2; i++ {
		if p.RetInt&(1<<i) != 0 {
			r.Int[i] = c.Int[i]
		}
		if p.RetSSE&(1<<i) != 0 {
			r.SSE[i] = c.SSE[i]
		}
	}
	if p.RetString {
		r.Str = cstring(c.Str[0])
	}
	return r
}

func cstring(s *struct {
	Bytes    string
	Complete bool
	Fault    bool
}) *CString {
	if s == nil {
		return nil
	}
	b, _ := hex.DecodeString(s.Bytes)
	return &CString{Bytes: b, Complete: s.Complete, Fault: s.Fault}
}

// TestSignaturesShow prints every signature of the fixture (go test -v).
func TestSignaturesShow(t *testing.T) {
	if !testing.Verbose() {
		t.Skip("only with -v")
	}
	for _, cc := range []string{"gcc", "clang"} {
		fx := testutil.Build(t, testutil.Spec{Compiler: cc, Opt: "-O2", Sources: []string{"args.c"}, Profile: testutil.ProfileFentry, NoInstr: true})
		tab, err := Open(fx.Path)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range tab.Addrs() {
			s, err := tab.Lookup(a)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(cc, s)
		}
	}
}

func (s *Signature) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s(", s.Ret.Type, s.Name)
	for i, p := range s.Params {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s@%s", p.Type, p.Name, partsString(p.Parts))
		if p.Missing != "" {
			fmt.Fprintf(&b, "[%s]", p.Missing)
		}
	}
	fmt.Fprintf(&b, ") ret@%s", partsString(s.Ret.Parts))
	if s.Ret.Missing != "" {
		fmt.Fprintf(&b, "[%s]", s.Ret.Missing)
	}
	if s.Changed != "" {
		fmt.Fprintf(&b, " changed: %s", s.Changed)
	}
	return b.String()
}

// TestUnoptimizedKeepsTheABI: at -O0 no compiler changes a calling
// convention, so no signature may say it did (C and C++: methods, this,
// templates, destructors).
func TestUnoptimizedKeepsTheABI(t *testing.T) {
	for _, spec := range []testutil.Spec{
		{Compiler: "g++", Sources: []string{"exc.cc"}, Opt: "-O0"},
		{Compiler: "clang++", Sources: []string{"exc.cc"}, Opt: "-O0"},
		{Compiler: "gcc", Sources: []string{"basic.c"}, Opt: "-O0"},
		{Compiler: "clang", Sources: []string{"basic.c"}, Opt: "-O0"},
	} {
		t.Run(spec.String(), func(t *testing.T) {
			tab, err := Open(testutil.Build(t, spec).Path)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, a := range tab.Addrs() {
				s, err := tab.Lookup(a)
				if err != nil {
					t.Fatal(err)
				}
				n++
				if s.Changed != "" {
					t.Errorf("%s: %s", s, s.Changed)
				}
				for i, p := range s.Params {
					if p.Name == "this" && (i != 0 || len(p.Parts) != 1 || p.Parts[0] != (Part{Kind: LocInt, Reg: 0, Size: 8})) {
						t.Errorf("%s: this is not the first argument, in rdi", s)
					}
				}
			}
			if n < 5 {
				t.Errorf("only %d functions", n)
			}
		})
	}
}
