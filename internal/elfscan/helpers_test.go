package elfscan

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// objdumpRefs is the independent count of hook sites: objdump's
// disassembly of every executable section but the PLTs, with the branches
// whose target objdump names as a hook (direct, "@plt", or the GOT slot's
// "@GLIBC..." symbol for -fno-plt calls).
type objdumpRefs struct {
	sites map[uint64]string // call and jmp, unconditional
	conds map[uint64]string // conditional branches
}

var objdumpTarget = regexp.MustCompile(`<(__cyg_profile_func_(?:enter_bare|enter|exit))(@plt|@[A-Z_0-9.]+)?>$`)

func objdumpHookRefs(t *testing.T, path string) objdumpRefs {
	t.Helper()
	refs := objdumpRefs{map[uint64]string{}, map[uint64]string{}}
	objdumpTargets(t, path, objdumpTarget, func(addr uint64, mnemonic, target string) {
		switch {
		case mnemonic == "call" || mnemonic == "jmp":
			refs.sites[addr] = target
		case strings.HasPrefix(mnemonic, "j"):
			refs.conds[addr] = target
		}
	})
	return refs
}

// objdumpTargets runs objdump -d over path and calls fn for every
// instruction outside the PLTs whose target objdump names and re matches,
// with the mnemonic (prefixes such as addr32 and bnd skipped) and re's first
// group.
func objdumpTargets(t *testing.T, path string, re *regexp.Regexp, fn func(addr uint64, mnemonic, target string)) {
	t.Helper()
	testutil.RequireTool(t, "objdump")
	out, err := exec.Command("objdump", "-d", "-w", "--no-show-raw-insn", path).Output()
	if err != nil {
		t.Fatalf("objdump -d %s: %v", path, err)
	}
	inPLT := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if sec, ok := strings.CutPrefix(line, "Disassembly of section "); ok {
			inPLT = strings.HasPrefix(sec, ".plt") || strings.HasPrefix(sec, ".iplt")
			continue
		}
		addr, insn, ok := strings.Cut(line, ":\t")
		if inPLT || !ok || !strings.HasPrefix(addr, " ") {
			continue
		}
		m := re.FindStringSubmatch(strings.TrimSpace(insn))
		if m == nil {
			continue
		}
		a, err := strconv.ParseUint(strings.TrimSpace(addr), 16, 64)
		if err != nil {
			t.Fatalf("objdump line %q", line)
		}
		f := strings.Fields(insn)
		for len(f) > 1 && (f[0] == "addr32" || f[0] == "bnd" || f[0] == "notrack") {
			f = f[1:]
		}
		fn(a, f[0], m[1])
	}
}

// functionStarts lists the function symbols per nm, independently of
// debug/elf.
func functionStarts(t *testing.T, path string) map[uint64]string {
	t.Helper()
	testutil.RequireTool(t, "nm")
	out, err := exec.Command("nm", "--defined-only", path).Output()
	if err != nil {
		t.Fatalf("nm %s: %v", path, err)
	}
	starts := map[uint64]string{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || !strings.ContainsAny(f[1], "TtWwi") {
			continue
		}
		a, err := strconv.ParseUint(f[0], 16, 64)
		if err == nil {
			starts[a] = f[2]
		}
	}
	return starts
}

func mustScan(t *testing.T, fx testutil.Fixture, opts Options) (*probelist.List, *Report) {
	t.Helper()
	l, rep, err := Scan(fx.Path, opts)
	if err != nil {
		t.Fatalf("scan: %v\n%s", err, fx.Command)
	}
	if err := l.Validate(); err != nil {
		t.Fatalf("invalid list: %v\n%s", err, fx.Command)
	}
	if len(rep.Sites) != len(l.Probes) {
		t.Fatalf("report has %d site states for %d probes", len(rep.Sites), len(l.Probes))
	}
	return l, rep
}

// coldCopy writes the inert bytes of every probe into a copy of the
// binary: what coldpatch does.
func coldCopy(t *testing.T, path string, l *probelist.List) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range l.Probes {
		at := data[p.Offset : int(p.Offset)+len(p.Active)]
		if !bytes.Equal(at, p.Active) {
			t.Fatalf("probe %d at %s: file has % x, list says active % x", p.ID, p.Address, at, p.Active)
		}
		copy(at, p.Inert)
	}
	out := path + ".cold"
	if err := os.WriteFile(out, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return out
}

type runResult struct {
	stdout, stderr string
	code           int
}

func run(t *testing.T, path string, args ...string) runResult {
	t.Helper()
	cmd := exec.Command(path, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := testutil.RunBound(cmd)
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run %s: %v", path, err)
	}
	return runResult{o.String(), e.String(), cmd.ProcessState.ExitCode()}
}

// siteKey is what a stripped build shares with its unstripped twin.
type siteKey struct {
	Address              uint64
	Kind, Hook, Encoding string
	Placeholder          string
	Active, Inert        string
	Resolved             bool
	FunctionAddress      uint64
}

func keys(l *probelist.List) []siteKey {
	var ks []siteKey
	for _, p := range l.Probes {
		ks = append(ks, siteKey{uint64(p.Address), p.Kind, p.Hook, p.Encoding, p.Placeholder, p.Active.String(), p.Inert.String(), p.Resolved, uint64(p.FunctionAddress)})
	}
	return ks
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeTemp(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := t.TempDir() + "/" + name
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// exported reports whether nm -D lists a hook defined in the object.
func exported(t *testing.T, path string) bool {
	t.Helper()
	out, _ := exec.Command("nm", "-D", "--defined-only", path).Output()
	return strings.Contains(string(out), " T "+hookEnter)
}
