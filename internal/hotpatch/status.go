package hotpatch

import (
	"fmt"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/ptrace"
)

// ProbeState is one probe's live state in a process.
type ProbeState struct {
	Object   string `json:"object"`
	ID       int    `json:"id"`
	Function string `json:"function"`
	Kind     string `json:"kind"`
	Provider string `json:"provider"` // "cyg" or "fentry"
	Address  string `json:"address"`  // run-time address
	State    string `json:"state"`    // "on", "off", "mid-patch" or "foreign"
	Bytes    string `json:"bytes"`    // what memory holds now
	Source   string `json:"source,omitempty"`
}

// Status reads every probe's live bytes. It reads /proc/PID/mem without
// attaching: reading needs no tracer, and a listing must not disturb anything.
func Status(pid int, probeFiles []string) ([]ProbeState, error) {
	pid = procfs.Via(pid) // the main thread may have exited (D95)
	targets, err := LoadTargets(pid, probeFiles)
	if err != nil {
		return nil, err
	}
	mem, err := ptrace.OpenMem(pid)
	if err != nil {
		return nil, err
	}
	defer mem.Close()
	var out []ProbeState
	for _, t := range targets {
		for i := 0; i < t.List.Len(); i++ {
			p, err := t.Probe(i)
			if err != nil {
				return nil, err
			}
			addr := t.Object.Runtime(uint64(p.Address))
			buf := make([]byte, len(p.Active))
			if err := mem.ReadMem(addr, buf); err != nil {
				return nil, fmt.Errorf("reading probe %d at %#x in %s: %w", p.ID, addr, t.Object.Path, err)
			}
			out = append(out, ProbeState{Object: t.Object.Path, ID: p.ID, Function: p.Function, Kind: p.Kind, Provider: p.Provider,
				Address: fmt.Sprintf("%#x", addr), State: liveState(p, buf), Bytes: probelist.Bytes(buf).String(), Source: p.Source})
		}
	}
	return out, nil
}

// liveState names what a site's bytes are: one of its forms, the int3 of a
// patch in progress (byte 0 is 0xcc and every other byte belongs to one of the
// two forms), or something else.
func liveState(p *probelist.Probe, b []byte) string {
	switch string(b) {
	case string(p.Active):
		return "on"
	case string(p.Inert):
		return "off"
	}
	if b[0] != 0xcc {
		return "foreign"
	}
	for i := 1; i < len(b); i++ {
		if b[i] != p.Active[i] && b[i] != p.Inert[i] {
			return "foreign"
		}
	}
	return "mid-patch"
}
