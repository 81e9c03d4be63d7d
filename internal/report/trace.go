package report

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
)

// Tracer accumulates a well-formed call stream (calltrace.Matcher's output)
// and writes it as Chrome trace-event JSON, the legacy format: one track
// per thread, one complete ("X") event per call, nested as the calls
// nested. The whole capture is held in memory until Write; Perfetto's own
// format (PerfettoSink) streams instead.
type Tracer struct {
	pid     int
	threads map[int32]*threadTrace
	order   []int32
	t0      uint64
	calls   int
}

type threadTrace struct {
	stack  []open
	events []traceEvent
}

type open struct {
	startNs uint64
	args    map[string]string
}

type traceEvent struct {
	Name string            `json:"name"`
	Cat  string            `json:"cat,omitempty"`
	Ph   string            `json:"ph"`
	Ts   float64           `json:"ts"`            // µs since the capture began
	Dur  *float64          `json:"dur,omitempty"` // µs
	Pid  int               `json:"pid"`
	Tid  int32             `json:"tid"`
	S    string            `json:"s,omitempty"` // instant scope
	Args map[string]string `json:"args,omitempty"`
}

// NewTracer starts an empty capture of process pid.
func NewTracer(pid int) *Tracer {
	return &Tracer{pid: pid, threads: map[int32]*threadTrace{}}
}

// Event implements calltrace.Sink.
func (t *Tracer) Event(e *calltrace.Event) error {
	th := t.threads[e.Thread]
	if th == nil {
		th = &threadTrace{}
		t.threads[e.Thread] = th
		t.order = append(t.order, e.Thread)
	}
	if t.t0 == 0 || e.TimeNs < t.t0 {
		t.t0 = e.TimeNs
	}
	switch e.Kind {
	case calltrace.Entry:
		th.stack = append(th.stack, open{e.TimeNs, argMap(e.Args, nil)})
	case calltrace.Exit:
		o := th.stack[len(th.stack)-1]
		th.stack = th.stack[:len(th.stack)-1]
		args := o.args
		if e.Ret != nil || e.Open || e.Unwound {
			if args == nil {
				args = map[string]string{}
			}
		}
		if e.Ret != nil {
			args["return"] = e.Ret.String()
		}
		// an end the Matcher made up, flagged as the Perfetto writer flags it
		if e.Open {
			args["still_running"] = "true"
		}
		if e.Unwound {
			args["unwound"] = "true"
		}
		d := float64(e.TimeNs-o.startNs) / 1e3
		th.events = append(th.events, traceEvent{Name: e.Func.Name, Cat: base(e.Func.Object), Ph: "X", Ts: float64(o.startNs),
			Dur: &d, Pid: t.pid, Tid: e.Thread, Args: args})
		t.calls++
	case calltrace.Instant:
		th.events = append(th.events, traceEvent{Name: e.Func.Name, Cat: base(e.Func.Object), Ph: "i", S: "t", Ts: float64(e.TimeNs),
			Pid: t.pid, Tid: e.Thread, Args: argMap(e.Args, nil)})
	case calltrace.Unloaded:
		th.events = append(th.events, traceEvent{Name: unloadedName, Ph: "i", S: "p", Ts: float64(e.TimeNs), Pid: t.pid, Tid: e.Thread,
			Args: map[string]string{"object": e.Func.Object}})
	case calltrace.Lost:
		th.events = append(th.events, traceEvent{Name: lostName, Ph: "i", S: "t", Ts: float64(e.TimeNs), Pid: t.pid, Tid: e.Thread,
			Args: map[string]string{"events": fmt.Sprint(e.Count)}})
	}
	return nil
}

func argMap(args []calltrace.Value, m map[string]string) map[string]string {
	for _, a := range args {
		if m == nil {
			m = map[string]string{}
		}
		m[a.Name] = a.String()
	}
	return m
}

// Close implements calltrace.Sink; the document is written by Write.
func (t *Tracer) Close() error { return nil }

// Calls is the number of complete calls captured so far.
func (t *Tracer) Calls() int { return t.calls }

// Write writes the JSON document.
func (t *Tracer) Write(w io.Writer) error {
	doc := struct {
		TraceEvents     []traceEvent `json:"traceEvents"`
		DisplayTimeUnit string       `json:"displayTimeUnit"`
	}{TraceEvents: []traceEvent{}, DisplayTimeUnit: "ns"}
	for _, tid := range t.order {
		th := t.threads[tid]
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
