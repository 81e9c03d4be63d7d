package hotpatch

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// readLive reads n bytes of the target at addr.
func readLive(t *testing.T, pid int, addr uint64, n int) []byte {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, int64(addr)); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestHostileLists: probe lists with the right build-id whose sites are
// well-formed enough to pass the live-bytes check (the site holds one of the
// listed forms) but are not hook sites: an address inside an instruction, on
// another instruction, an active form changed to a jmp, a foreign inert
// form, a wrong hook, and their NOP-placeholder variants. Before issue 11
// three such lists killed their targets. Each must be refused with one line
// naming the disagreement, exit 1, and the target's bytes around the site
// unchanged; the target keeps computing right results.
func TestHostileLists(t *testing.T) {
	testutil.RequirePtrace(t)
	for _, placeholder := range []string{"flip", "nop"} {
		t.Run(placeholder, func(t *testing.T) {
			s := startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, placeholder, true)
			good, err := probelist.ReadFile(s.probeArgs[1])
			if err != nil {
				t.Fatal(err)
			}
			targets, err := LoadTargets(s.Pid, s.probeArgs[1:])
			if err != nil {
				t.Fatal(err)
			}
			target := targets[0]
			// The entry probe of work: a call the workers run all the time.
			pi := -1
			for i, p := range good.Probes {
				if p.Function == "work" && p.Kind == probelist.KindEntry && p.Encoding == probelist.EncCallRel32 {
					pi = i
				}
			}
			if pi < 0 {
				t.Fatal("no call_rel32 entry probe of work in the list")
			}
			orig := good.Probes[pi]
			at := func(p probelist.Probe) uint64 { return target.Object.Runtime(uint64(p.Address)) }
			live := func(p probelist.Probe) []byte { return readLive(t, s.Pid, at(p), len(p.Active)) }
			workAddr := uint64(0)
			for _, p := range good.Probes {
				if p.Function == "work" && p.FunctionAddress != 0 {
					workAddr = uint64(p.FunctionAddress)
				}
			}
			if workAddr == 0 {
				t.Fatal("work's address is not in the list")
			}
			flipped := func(b []byte) probelist.Bytes {
				o := append(probelist.Bytes(nil), b...)
				o[0] ^= 0x80
				return o
			}
			// Each case edits the probe; its live bytes are made to match one
			// form so that only the scan check stands between the list and a
			// write.
			moved := func(delta int64) func(p *probelist.Probe) {
				return func(p *probelist.Probe) {
					p.Address = probelist.Hex(int64(p.Address) + delta)
					p.Offset = probelist.Hex(int64(p.Offset) + delta)
					p.Active = live(*p)
					p.Inert = flipped(p.Active)
				}
			}
			cases := []struct {
				name string
				edit func(p *probelist.Probe)
			}{
				{"inside the call, +1", moved(1)},
				{"inside the call, +2", moved(2)},
				{"inside the call, +4", moved(4)},
				{"the next instruction", moved(5)},
				{"the function's first instruction", func(p *probelist.Probe) {
					moved(int64(workAddr) - int64(p.Address))(p)
				}},
				{"active changed to a jmp", func(p *probelist.Probe) {
					p.Active = append(probelist.Bytes{0xe9}, p.Active[1:]...)
					if placeholder == "flip" {
						p.Inert = append(probelist.Bytes{0x3d}, p.Active[1:]...)
					}
				}},
				{"active a jmp, encoding jmp_rel32", func(p *probelist.Probe) {
					p.Active = append(probelist.Bytes{0xe9}, p.Active[1:]...)
					p.Encoding = probelist.EncJmpRel32
				}},
				{"inert a jmp to the hook", func(p *probelist.Probe) {
					p.Inert = append(probelist.Bytes{0xe9}, p.Active[1:]...)
				}},
				{"both forms call elsewhere", func(p *probelist.Probe) {
					p.Active[1] += 0x10
					p.Inert[1] += 0x10
				}},
				{"hook renamed", func(p *probelist.Probe) {
					if p.Hook == "__cyg_profile_func_enter" {
						p.Hook = "__cyg_profile_func_exit"
					} else {
						p.Hook = "__cyg_profile_func_enter"
					}
				}},
				{"offset of another site", func(p *probelist.Probe) {
					for _, q := range good.Probes {
						if q.Address != p.Address && q.Encoding == p.Encoding {
							p.Offset = q.Offset
							return
						}
					}
				}},
				{"encoding renamed", func(p *probelist.Probe) {
					p.Encoding = probelist.EncAddr32Call
				}},
			}
			if len(cases) != 12 {
				t.Fatalf("%d cases", len(cases))
			}
			window := func(p probelist.Probe) []byte { return readLive(t, s.Pid, at(orig)-32, 96) }
			for _, c := range cases {
				l := *good
				l.Probes = append([]probelist.Probe(nil), good.Probes...)
				p := l.Probes[pi]
				p.Active = append(probelist.Bytes(nil), p.Active...)
				p.Inert = append(probelist.Bytes(nil), p.Inert...)
				c.edit(&p)
				l.Probes[pi] = p
				file := filepath.Join(t.TempDir(), "hostile.json")
				if err := l.WriteFile(file); err != nil {
					// The list's own validation refused it: as good a refusal.
					t.Logf("%s: refused when written: %v", c.name, err)
					continue
				}
				// Write the form the site does not hold now.
				verb := "--enable"
				if bytes.Equal(live(p), p.Active) {
					verb = "--disable"
				}
				before := window(p)
				r := command(t, "hotpatch", "--pid", fmt.Sprint(s.Pid), "--probes", file, "--protocol", "auto", verb, fmt.Sprintf("id:%d", p.ID))
				// Refused by the scan check, the live-bytes check (both say
				// nothing was written) or the list's own validation.
				if r.Code != 1 || strings.Count(r.Stderr, "\n") != 1 ||
					!(strings.Contains(r.Stderr, "nothing was written") || strings.Contains(r.Stderr, "invalid probe list")) {
					t.Errorf("%s: exit %d, stderr %q; want exit 1 and one line refusing the list", c.name, r.Code, r.Stderr)
				}
				if after := window(p); !bytes.Equal(before, after) {
					t.Errorf("%s: the target's code changed:\n% x\n% x", c.name, before, after)
				}
				if !s.Alive() {
					t.Fatalf("%s: target died", c.name)
				}
				t.Logf("%s: %s", c.name, strings.TrimSpace(r.Stderr))
			}
			s.finish(t)
		})
	}
}
