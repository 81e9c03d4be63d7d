package report

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/edgeprobe/edgeprobe/internal/shm"
)

// Tracer accumulates a capture's events per thread and writes them as
// Chrome trace-event JSON: one track per thread, one complete ("X") event per
// call, nested as the calls nested.
type Tracer struct {
	pid      int
	sym      *Symbolizer
	names    map[uint64][2]string // address -> name, object: one lookup per function
	threads  map[int32]*threadTrace
	order    []int32
	t0       uint64
	calls    int
	Unpaired uint64 // exits with no entry in the capture (the call began before it)
}

type threadTrace struct {
	stack  []open
	events []traceEvent
	lastNs uint64
}

type open struct {
	addr, startNs uint64
	bare          bool
}

type traceEvent struct {
	Name string            `json:"name"`
	Cat  string            `json:"cat,omitempty"`
	Ph   string            `json:"ph"`
	Ts   float64           `json:"ts"`            // µs since the capture began
	Dur  *float64          `json:"dur,omitempty"` // µs
	Pid  int               `json:"pid"`
	Tid  int32             `json:"tid"`
	Args map[string]string `json:"args,omitempty"`
}

// NewTracer starts an empty capture of process pid.
func NewTracer(pid int, sym *Symbolizer) *Tracer {
	return &Tracer{pid: pid, sym: sym, threads: map[int32]*threadTrace{}, names: map[uint64][2]string{}}
}

// Add records one event of thread tid, in the order the thread produced it.
func (t *Tracer) Add(tid int32, e shm.Event) {
	if e.Kind == shm.EvThread {
		return
	}
	th := t.threads[tid]
	if th == nil {
		th = &threadTrace{}
		t.threads[tid] = th
		t.order = append(t.order, tid)
	}
	if t.t0 == 0 || e.TimeNs < t.t0 {
		t.t0 = e.TimeNs
	}
	th.lastNs = e.TimeNs
	addr, bare := e.Addr&^shm.KeyBare, e.Addr&shm.KeyBare != 0
	if e.Kind == shm.EvEnter {
		th.stack = append(th.stack, open{addr, e.TimeNs, bare})
		return
	}
	// An exit closes its call and any calls above it left open by a longjmp
	// or an exception; an exit whose entry preceded the capture is counted.
	for i := len(th.stack) - 1; i >= 0; i-- {
		if th.stack[i].addr == addr {
			for j := len(th.stack) - 1; j >= i; j-- {
				t.complete(tid, th, th.stack[j], e.TimeNs)
			}
			th.stack = th.stack[:i]
			return
		}
	}
	t.Unpaired++
}

func (t *Tracer) complete(tid int32, th *threadTrace, o open, endNs uint64) {
	n, ok := t.names[o.addr]
	if !ok {
		name, obj := t.sym.Name(o.addr, !o.bare)
		n = [2]string{name, base(obj)}
		t.names[o.addr] = n
	}
	d := float64(endNs-o.startNs) / 1e3
	th.events = append(th.events, traceEvent{Name: n[0], Cat: n[1], Ph: "X", Ts: float64(o.startNs), Dur: &d, Pid: t.pid, Tid: tid})
	t.calls++
}

// Calls is the number of complete calls captured so far.
func (t *Tracer) Calls() int { return t.calls }

// Write closes calls still open at the end of the capture and writes the
// JSON document.
func (t *Tracer) Write(w io.Writer) error {
	doc := struct {
		TraceEvents     []traceEvent `json:"traceEvents"`
		DisplayTimeUnit string       `json:"displayTimeUnit"`
	}{TraceEvents: []traceEvent{}, DisplayTimeUnit: "ns"}
	for _, tid := range t.order {
		th := t.threads[tid]
		for j := len(th.stack) - 1; j >= 0; j-- {
			t.complete(tid, th, th.stack[j], th.lastNs)
		}
		th.stack = nil
		doc.TraceEvents = append(doc.TraceEvents, traceEvent{Name: "thread_name", Ph: "M", Pid: t.pid, Tid: tid,
			Args: map[string]string{"name": threadName(tid)}})
		for _, e := range th.events {
			e.Ts = (e.Ts - float64(t.t0)) / 1e3
			doc.TraceEvents = append(doc.TraceEvents, e)
		}
	}
	enc := json.NewEncoder(w)
	return enc.Encode(doc)
}

func threadName(tid int32) string { return fmt.Sprintf("thread %d", tid) }
