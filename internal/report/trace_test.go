package report

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/shm"
)

// TestTracerStack feeds one thread's events with the irregularities real
// captures have: an exit whose entry preceded the capture, an exit that skips
// frames (longjmp), and a call still open at the end.
func TestTracerStack(t *testing.T) {
	tr := NewTracer(1, &Symbolizer{})
	ev := func(kind int, ns, addr uint64) { tr.Add(7, shm.Event{Kind: kind, TimeNs: ns, Addr: addr}) }
	ev(shm.EvExit, 100, 0xa)   // began before the capture: unpaired
	ev(shm.EvEnter, 200, 0xb)  // b
	ev(shm.EvEnter, 300, 0xc)  //   c
	ev(shm.EvEnter, 400, 0xd)  //     d (never exits: longjmp)
	ev(shm.EvExit, 900, 0xc)   //   c exits, closing d
	ev(shm.EvEnter, 1000, 0xe) //   e (open at the end)
	ev(shm.EvExit, 1100, 0xf)  // never entered: unpaired
	if tr.Unpaired != 2 || tr.Calls() != 2 {
		t.Fatalf("unpaired %d, calls %d; want 2 and 2", tr.Unpaired, tr.Calls())
	}
	var buf bytes.Buffer
	if err := tr.Write(&buf); err != nil {
		t.Fatal(err)
	}
	var doc struct{ TraceEvents []traceEvent }
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	got := map[string][2]float64{}
	for _, e := range doc.TraceEvents {
		if e.Ph == "X" {
			got[e.Name] = [2]float64{e.Ts, *e.Dur}
		}
	}
	// Timestamps are µs from the first event (100 ns).
	want := map[string][2]float64{
		"sub_c": {0.2, 0.6}, "sub_d": {0.3, 0.5}, // d closed by c's exit
		"sub_e": {0.9, 0.1}, "sub_b": {0.1, 0.9}, // open at the end: closed at the last event
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok || abs(g[0]-w[0]) > 1e-9 || abs(g[1]-w[1]) > 1e-9 {
			t.Errorf("%s: ts/dur %v, want %v (all: %v)", name, g, w, got)
		}
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
