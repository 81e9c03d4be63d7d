package shm

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Memory is what a process's region costs it, from /proc/PID/smaps: the
// region's mappings (MemfdName) summed.
type Memory struct {
	ResidentKiB uint64 // pages in memory (Rss): what the region costs
	SizeKiB     uint64 // address space (Size): the tables up to their caps
	// DumpedKiB is the address space a core dump of the process would
	// read (mappings without VmFlags "dd", MADV_DONTDUMP): the reserves
	// beyond what a small program uses are left out.
	DumpedKiB uint64
	// AllocatedKiB is the memory the region's file holds (its st_blocks):
	// every page written by the process or by a reader, whether mapped in
	// the process or not. 0 when the file cannot be examined.
	AllocatedKiB uint64
}

// ReadMemory reads the region's resident and mapped size in process pid.
// It fails with ErrNoRuntime (and os.ErrNotExist) when the process maps no
// region.
func ReadMemory(pid int) (Memory, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return Memory{}, fmt.Errorf("shm: pid %d: %w", pid, err)
	}
	var m Memory
	in, found := false, false
	var size uint64 // of the current mapping
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			// A mapping's first line: range perms offset dev inode [path...].
			name := ""
			if len(f) >= 6 {
				name = strings.Join(f[5:], " ")
			}
			in = name == MemfdName || strings.HasPrefix(name, MemfdName+" ")
			found = found || in
			continue
		}
		if !in || len(f) < 2 {
			continue
		}
		if f[0] == "VmFlags:" {
			dd := false
			for _, fl := range f[1:] {
				dd = dd || fl == "dd"
			}
			if !dd {
				m.DumpedKiB += size
			}
			continue
		}
		n, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "Rss:":
			m.ResidentKiB += n
		case "Size:":
			m.SizeKiB += n
			size = n
		}
	}
	if !found {
		return Memory{}, fmt.Errorf("shm: pid %d maps no %s: %w (%w)", pid, MemfdName, ErrNoRuntime, os.ErrNotExist)
	}
	// The region's file, taken from the process (takeFD): a stat of its
	// /proc/PID/fd path would ask whatever file the program put there since.
	_ = regionFiles(pid, func(f *os.File, _ int, err error) bool {
		var st syscall.Stat_t
		if err != nil || syscall.Fstat(int(f.Fd()), &st) != nil {
			return false
		}
		m.AllocatedKiB = uint64(st.Blocks) * 512 / 1024
		return true
	})
	return m, nil
}
