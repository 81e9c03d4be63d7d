package report

import (
	"bufio"
	"fmt"
	"io"
	"strings"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
)

// TextSink prints a call stream as a per-thread call graph, the way
// uftrace replay does: one line per call that made no probed call
// ("f(n=1) = 1;", with its duration), an opening and a closing line for one
// that did, indented by depth, each thread's lines marked with its id.
// Threads' lines interleave in the order their events arrive.
//
//	# DURATION     TID     FUNCTION
//	            [  4242] | fib(n=3) {
//	   0.120 us [  4242] |   fib(n=2) = 1;
//	   0.350 us [  4242] | } = 2; /* fib */
type TextSink struct {
	w       *bufio.Writer
	threads map[int32]*textThread
	header  bool
	// werr is the first write error (a full disk, a file-size limit): the
	// next Event returns it, so a capture stops instead of tracing on for
	// its whole duration into a file that cannot grow.
	werr error
}

type textThread struct {
	stack   []uint64 // entry times of the open calls
	pending *calltrace.Event
	args    []calltrace.Value
}

// NewTextSink prints to w.
func NewTextSink(w io.Writer) *TextSink {
	return &TextSink{w: bufio.NewWriter(w), threads: map[int32]*textThread{}}
}

// Event implements calltrace.Sink.
func (s *TextSink) Event(e *calltrace.Event) error {
	if !s.header {
		s.header = true
		if _, err := fmt.Fprintln(s.w, "# DURATION     TID     FUNCTION"); err != nil && s.werr == nil {
			s.werr = err
		}
	}
	th := s.threads[e.Thread]
	if th == nil {
		th = &textThread{}
		s.threads[e.Thread] = th
	}
	switch e.Kind {
	case calltrace.Entry:
		s.flushPending(e.Thread, th)
		p := *e
		th.args = append(th.args[:0], e.Args...) // events are only valid during the call
		p.Args = th.args
		th.pending = &p
		th.stack = append(th.stack, e.TimeNs)
	case calltrace.Exit:
		depth := len(th.stack) - 1
		if depth < 0 {
			return fmt.Errorf("thread %d: an exit of %s with no open call (the stream is not well-formed)", e.Thread, calltrace.Printable(e.Func.Name))
		}
		d := e.TimeNs - th.stack[depth]
		th.stack = th.stack[:depth]
		note := exitNote(e)
		if th.pending != nil {
			call := calltrace.FormatCall(th.pending.Func.Name, th.pending.Args)
			th.pending = nil
			s.line(durText(d, e.Open), e.Thread, depth, call+retText(e.Ret)+";"+note)
			break
		}
		closing := "}"
		if e.Ret != nil {
			closing += retText(e.Ret) + ";"
		}
		s.line(durText(d, e.Open), e.Thread, depth, closing+" /* "+calltrace.Printable(e.Func.Name)+" */"+note)
	case calltrace.Instant:
		s.flushPending(e.Thread, th)
		s.line("", e.Thread, len(th.stack), calltrace.FormatCall(e.Func.Name, e.Args)+";")
	case calltrace.Lost:
		s.flushPending(e.Thread, th)
		s.line("", e.Thread, len(th.stack), fmt.Sprintf("/* %d events lost here: the ring was full */", e.Count))
	case calltrace.Unloaded:
		s.flushPending(e.Thread, th)
		s.line("", e.Thread, 0, "/* "+UnloadedText(e.Func.Object)+" */")
	}
	return s.werr
}

// UnloadedText says that the process unloaded object (calltrace.Unloaded),
// names escaped for a terminal.
func UnloadedText(object string) string {
	return "the process unloaded " + calltrace.Printable(object) + " here: its probes went with it"
}

func exitNote(e *calltrace.Event) string {
	switch {
	case e.Unwound:
		return " /* unwound: never returned (longjmp, exception) */"
	case e.Open:
		return " /* still running when the capture ended */"
	}
	return ""
}

func retText(r *calltrace.Value) string {
	if r == nil {
		return ""
	}
	return " = " + r.String()
}

// flushPending prints the opening line of the call still waiting to know
// whether it is a leaf: something happened inside it.
func (s *TextSink) flushPending(tid int32, th *textThread) {
	if th.pending == nil {
		return
	}
	s.line("", tid, len(th.stack)-1, calltrace.FormatCall(th.pending.Func.Name, th.pending.Args)+" {")
	th.pending = nil
}

func (s *TextSink) line(dur string, tid int32, depth int, text string) {
	if _, err := fmt.Fprintf(s.w, "%11s [%6d] | %s%s\n", dur, tid, strings.Repeat("  ", max(depth, 0)), text); err != nil && s.werr == nil {
		s.werr = err
	}
}

// durText renders a duration in uftrace's units; "+" marks one that was
// still growing when the capture ended.
func durText(ns uint64, open bool) string {
	var s string
	switch {
	case ns < 1_000_000:
		s = fmt.Sprintf("%.3f us", float64(ns)/1e3)
	case ns < 1_000_000_000:
		s = fmt.Sprintf("%.3f ms", float64(ns)/1e6)
	default:
		s = fmt.Sprintf("%.3f  s", float64(ns)/1e9)
	}
	if open {
		s = "+" + s
	}
	return s
}

// Close implements calltrace.Sink.
func (s *TextSink) Close() error {
	for tid, th := range s.threads {
		s.flushPending(tid, th)
	}
	return s.w.Flush()
}
