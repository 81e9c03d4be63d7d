package bench

import (
	"fmt"

	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// table2 puts the paper's Table 2 (TSC ticks) beside this run's figures.
func (h *Harness) table2() {
	tk := func(key string) string {
		if s, ok := h.Rep.Stats[key]; ok && s.N > 0 {
			return fmtNum(s.MedianTicks)
		}
		if v, ok := h.Rep.Values[key].(float64); ok {
			return fmtNum(h.TSC.Ticks(v))
		}
		return "-"
	}
	inv := tk("invoke.empty")
	rows := [][]string{
		{"paper: fastinst sync, non-straddlers", "300", "120", "35", "Xeon E5-2670 class, in-process"},
		{"paper: fastinst sync, straddlers", "8,850", "8,435", "35", ""},
		{"paper: fastinst callpatch", "432", "315", "35", ""},
		{"paper: JVM VolatileCallSite", "995", "", "55", ""},
		{"paper: JVM MutableCallSite", "1,432", "", "83", ""},
		{"paper: Dyninst", "1,929,244", "995,447", "320", ""},
		{"paper: DTrace", "~70,771", "", "1,176", "MacBook Pro 2014"},
		{"edgeprobe flip", tk("toggle_detail.flip.activation"), tk("toggle_detail.flip.deactivation"), inv, "cross-process pwrite; invocation: empty preloaded handler"},
		{"edgeprobe int3", tk("toggle_detail.int3.activation"), tk("toggle_detail.int3.deactivation"), inv, "2 waits of " + h.waitText() + " + Sync"},
		{"edgeprobe int3-async (Start)", tk("toggle_detail.int3_async.activation"), tk("toggle_detail.int3_async.deactivation"), inv, "completion: " + tk("toggle_detail.int3_async.complete")},
		{"edgeprobe stop", tk("toggle_detail.stop.activation"), tk("toggle_detail.stop.deactivation"), inv, ""},
		{"edgeprobe runtime handler", "", "", tk("invoke.runtime"), "count + latency; count only: " + tk("invoke.runtime_count_only")},
		{"uprobe (tracefs)", tk("peers.uprobe_attach"), "", tk("peers.uprobe_hit"), "per hit of uprobe/uretprobe"},
		{"LLVM XRay", tk("peers.xray_attach"), tk("peers.xray_detach"), tk("peers.xray_hit"), "__xray_patch/unpatch per function"},
		{"gdb breakpoint", tk("peers.gdb_attach"), "", tk("peers.gdb_hit"), ""},
	}
	h.Rep.Add(Section{Title: "Table 2 beside ours (TSC ticks)",
		Text: fmt.Sprintf("Chamith et al.'s Table 2 (average cost in TSC ticks, single core) and this run's medians converted at the calibrated %.1f MHz. Invocation is per probe hit. Our activation/deactivation are made from another process, theirs from inside the target.", h.TSC.Hz/1e6),
		Head: []string{"method", "activation", "deactivation", "invocation", "note"}, Rows: rows})
}

func (h *Harness) waitText() string {
	switch {
	case h.Cfg.Int3Wait < 0:
		return "0 (" + h.waitSource + ")"
	case h.Cfg.Int3Wait != 0:
		return h.Cfg.Int3Wait.String() + " (" + h.waitSource + ")"
	}
	return xmod.DefaultWait.String() + " (xmod.DefaultWait)"
}
