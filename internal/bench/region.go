package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/edgeprobe/edgeprobe/internal/cgen"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/shm"
)

// RegionGoalKiB is issue 9's goal for the region of an idle preloaded
// process: at most 1 MiB resident.
const RegionGoalKiB = 1024

// regionFuncs is the size of the region row's generated program.
const regionFuncs = 20_000

// RunRegion is row 8: what the runtime's region costs a process, from
// /proc/PID/smaps (shm.ReadMemory): the generated program of regionFuncs
// instrumented functions (internal/cgen.Counted, gcc -O0, 4 threads x 2
// passes calling every function 1-3 times), preloaded, once coldpatched (no
// probe enabled: the idle figure, goal <= RegionGoalKiB) and once as built
// (every probe on: the function table grows to hold every function). Each
// figure is read after the program's calls are done, while it waits.
// Memory in KiB, not time: the keys end in _kib. Then row 8b
// (runTableChain): what the table's segments cost a hook.
func (h *Harness) RunRegion(ctx context.Context) error {
	bin, err := h.regionMemory(ctx)
	if err != nil {
		return err
	}
	return h.runTableChain(ctx, bin)
}

// regionMemory is row 8 proper; it returns the all-enabled program for 8b.
func (h *Harness) regionMemory(ctx context.Context) (string, error) {
	sec := Section{Title: "8. Region memory",
		Text: fmt.Sprintf("The runtime's shared-memory region in a preloaded process: resident KiB (its pages mapped in the process), file holds KiB (the memfd's allocated size, read after the row's own reads of the region: what the region costs) and mapped KiB (address space, the function table reserved up to its cap) from /proc/PID/smaps. In a core dump: the part a core dump would read (the table's reserve beyond its first segment is MADV_DONTDUMP). The program: %d instrumented functions (internal/cgen.Counted, gcc -O0), 4 threads x 2 passes calling every function 1-3 times; idle = coldpatched (every site inert, no probe enabled), all enabled = as built (every call recorded: the function table grows to hold every function). Goal for idle (issue 9): <= %d KiB.", regionFuncs, RegionGoalKiB),
		Head: []string{"process", "resident KiB", "file holds KiB", "mapped KiB", "in a core dump KiB", "function table", "goal"}}
	defer func() { h.Rep.Add(sec) }()
	src := filepath.Join(h.B.Dir, fmt.Sprintf("counted%d.c", regionFuncs))
	if err := os.WriteFile(src, cgen.Counted(regionFuncs), 0o644); err != nil {
		return "", err
	}
	bin, err := h.B.Build(fmt.Sprintf("counted%d", regionFuncs), "gcc", []string{"-O0", "-g", "-pthread", "-finstrument-functions"}, src)
	if err != nil {
		return "", err
	}
	cold, _, err := h.B.Cold(bin, fmt.Sprintf("counted%d-cold", regionFuncs), probelist.PlaceholderFlip)
	if err != nil {
		return "", err
	}
	for _, c := range []struct {
		key, name, bin, goal string
	}{
		{"idle", "idle (coldpatched, no probe enabled)", cold, fmt.Sprintf("<= %d KiB", RegionGoalKiB)},
		{"all20k", fmt.Sprintf("all %d functions enabled, every call recorded", regionFuncs), bin, "grows with what is recorded"},
	} {
		m, slots, segs, used, err := h.regionOf(ctx, c.bin)
		if err != nil {
			return "", fmt.Errorf("%s: %w", c.key, err)
		}
		// The row measures what it says: nothing recorded while idle, every
		// function recorded when all are enabled.
		if want := map[bool]uint64{true: 0, false: regionFuncs}[c.key == "idle"]; used != want {
			return "", fmt.Errorf("%s: %d functions recorded, want %d", c.key, used, want)
		}
		h.Rep.Set("region."+c.key+"_kib", float64(m.ResidentKiB))
		h.Rep.Set("region."+c.key+"_mapped_kib", float64(m.SizeKiB))
		goal := c.goal
		if c.key == "idle" {
			if max(m.ResidentKiB, m.AllocatedKiB) <= RegionGoalKiB {
				goal += ": met"
			} else {
				goal += ": NOT met"
			}
		}
		h.Rep.Set("region."+c.key+"_dumped_kib", float64(m.DumpedKiB))
		h.Rep.Set("region."+c.key+"_allocated_kib", float64(m.AllocatedKiB))
		sec.Rows = append(sec.Rows, []string{c.name, fmt.Sprint(m.ResidentKiB), fmt.Sprint(m.AllocatedKiB), fmt.Sprint(m.SizeKiB), fmt.Sprint(m.DumpedKiB),
			fmt.Sprintf("%d functions in %d slots, %d segments", used, slots, segs), goal})
	}
	return bin, nil
}

// runTableChain is row 8b: what the function table's chain of segments
// costs a hook. The same all-enabled program, one thread making passes over
// its 20,000 functions (a thread's 64-entry counter cache cannot hold them,
// so every hook looks its function up in the shared table), with the table
// in one segment (EDGEPROBE_FIRST_FUNCS=32768), as by default (16,384 + 16,384),
// and from a 64-slot first segment (ten segments); per call, the target's
// CPU time (/proc/PID/schedstat, start-up included) over its calls, and the
// ratio to one segment in the same run (configurations interleaved per rep).
// Without the runtime (glibc's empty hooks) for scale.
func (h *Harness) runTableChain(ctx context.Context, bin string) error {
	passes := int(max(1, h.Cfg.InvokeN/400_000))
	var perPass uint64
	for i := 0; i < regionFuncs; i++ {
		perPass += cgen.CountedCalls(i)
	}
	calls := float64(uint64(passes) * perPass)
	sec := Section{Title: "8b. Function-table chain cost",
		Text: fmt.Sprintf("What the function table's chain of segments (D35) costs a hook: the region row's program, every probe on, one thread making %d passes over its %d functions (%d calls: a thread's 64-entry counter cache cannot hold them, so every hook looks its function up in the shared table), its CPU time per call (/proc/PID/schedstat, start-up included), the table in one segment (EDGEPROBE_FIRST_FUNCS=32768), as by default (two segments), and from a 64-slot first segment (ten segments); ratio to one segment, measured in the same run, configurations interleaved.", passes, regionFuncs, uint64(calls)),
		Head: []string{"table", "CPU ns per call", "ratio to one segment"}}
	defer func() { h.Rep.Add(sec) }()
	cfgs := []struct {
		key, name string
		env       []string
	}{
		{"none", "no runtime (glibc's empty hooks)", nil},
		{"one", "one segment (EDGEPROBE_FIRST_FUNCS=32768)", []string{"LD_PRELOAD=" + h.Runtime, "EDGEPROBE_FIRST_FUNCS=32768"}},
		{"default", "default: 16,384 + 16,384 slots, two segments", []string{"LD_PRELOAD=" + h.Runtime}},
		{"first64", "64-slot first segment: ten segments", []string{"LD_PRELOAD=" + h.Runtime, "EDGEPROBE_FIRST_FUNCS=64"}},
	}
	ns := map[string][]float64{}
	for rep := 0; rep < h.Cfg.Reps; rep++ {
		for _, c := range cfgs {
			cpu, err := h.countedCPU(ctx, c.env, bin, passes)
			if err != nil {
				return fmt.Errorf("chain %s: %w", c.key, err)
			}
			ns[c.key] = append(ns[c.key], float64(cpu)/calls)
		}
	}
	one := Summarize(ns["one"], h.TSC)
	for _, c := range cfgs {
		s := Summarize(ns[c.key], h.TSC)
		h.Rep.SetStat("region.chain_ns."+c.key, s)
		ratio := "-"
		if c.key != "none" && one.MedianNs > 0 {
			r := s.MedianNs / one.MedianNs
			h.Rep.Set("region.chain_ratio."+c.key, r)
			ratio = fmt.Sprintf("%.2f", r)
		}
		sec.Rows = append(sec.Rows, []string{c.name, Cell(s), ratio})
	}
	return nil
}

// countedCPU runs bin (a cgen.Counted program) with env for passes passes on one
// thread and returns the CPU time its thread used, in ns, read once its calls
// are done.
func (h *Harness) countedCPU(ctx context.Context, env []string, bin string, passes int) (uint64, error) {
	stop := filepath.Join(h.B.Dir, "region.stop")
	os.Remove(stop)
	t, err := Start(ctx, env, bin, stop, strconv.Itoa(passes), "1")
	if err != nil {
		return 0, err
	}
	defer t.Kill()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", t.Pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 0, fmt.Errorf("/proc/%d/schedstat: %q", t.Pid, b)
	}
	return strconv.ParseUint(f[0], 10, 64)
}

// regionOf runs bin (a cgen.Counted program) preloaded with the runtime
// until its calls are done and reads its region's memory and table.
func (h *Harness) regionOf(ctx context.Context, bin string) (m shm.Memory, slots uint64, segs uint32, used uint64, err error) {
	stop := filepath.Join(h.B.Dir, "region.stop")
	os.Remove(stop)
	t, err := Start(ctx, []string{"LD_PRELOAD=" + h.Runtime}, bin, stop, "2", "4")
	if err != nil {
		return m, 0, 0, 0, err
	}
	defer t.Kill()
	r, err := shm.OpenPID(t.Pid)
	if err != nil {
		return m, 0, 0, 0, err
	}
	defer r.Close()
	// Read the region as hotpatch stats does before measuring: a reader
	// must not add to what the region holds.
	r.Functions()
	c := r.Counters()
	if c.FuncDropEnters+c.FuncDropExits != 0 {
		return m, 0, 0, 0, fmt.Errorf("%d hooks counted as function_table_full", c.FuncDropEnters+c.FuncDropExits)
	}
	if m, err = shm.ReadMemory(t.Pid); err != nil {
		return m, 0, 0, 0, err
	}
	return m, r.FuncSlots(), r.Header().FuncSegs, c.FuncsUsed, nil
}
