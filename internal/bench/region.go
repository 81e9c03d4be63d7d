package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

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
// Memory in KiB, not time: the keys end in _kib.
func (h *Harness) RunRegion(ctx context.Context) error {
	sec := Section{Title: "8. Region memory",
		Text: fmt.Sprintf("The runtime's shared-memory region in a preloaded process: resident KiB (its pages mapped in the process), file holds KiB (the memfd's allocated size, read after the row's own reads of the region: what the region costs) and mapped KiB (address space, the function table reserved up to its cap) from /proc/PID/smaps. In a core dump: the part a core dump would read (the table's reserve beyond its first segment is MADV_DONTDUMP). The program: %d instrumented functions (internal/cgen.Counted, gcc -O0), 4 threads x 2 passes calling every function 1-3 times; idle = coldpatched (every site inert, no probe enabled), all enabled = as built (every call recorded: the function table grows to hold every function). Goal for idle (issue 9): <= %d KiB.", regionFuncs, RegionGoalKiB),
		Head: []string{"process", "resident KiB", "file holds KiB", "mapped KiB", "in a core dump KiB", "function table", "goal"}}
	defer func() { h.Rep.Add(sec) }()
	src := filepath.Join(h.B.Dir, fmt.Sprintf("counted%d.c", regionFuncs))
	if err := os.WriteFile(src, cgen.Counted(regionFuncs), 0o644); err != nil {
		return err
	}
	bin, err := h.B.Build(fmt.Sprintf("counted%d", regionFuncs), "gcc", []string{"-O0", "-g", "-pthread", "-finstrument-functions"}, src)
	if err != nil {
		return err
	}
	cold, _, err := h.B.Cold(bin, fmt.Sprintf("counted%d-cold", regionFuncs), probelist.PlaceholderFlip)
	if err != nil {
		return err
	}
	for _, c := range []struct {
		key, name, bin, goal string
	}{
		{"idle", "idle (coldpatched, no probe enabled)", cold, fmt.Sprintf("<= %d KiB", RegionGoalKiB)},
		{"all20k", fmt.Sprintf("all %d functions enabled, every call recorded", regionFuncs), bin, "grows with what is recorded"},
	} {
		m, slots, segs, used, err := h.regionOf(ctx, c.bin)
		if err != nil {
			return fmt.Errorf("%s: %w", c.key, err)
		}
		// The row measures what it says: nothing recorded while idle, every
		// function recorded when all are enabled.
		if want := map[bool]uint64{true: 0, false: regionFuncs}[c.key == "idle"]; used != want {
			return fmt.Errorf("%s: %d functions recorded, want %d", c.key, used, want)
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
	return nil
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
