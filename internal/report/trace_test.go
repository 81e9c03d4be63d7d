package report

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
)

type rawEv struct {
	kind calltrace.Kind
	ns   uint64
	fn   string
	args []calltrace.Value
	ret  *calltrace.Value
}

// feed passes one thread's raw events through a Matcher into sink.
func feed(t *testing.T, sink calltrace.Sink, tid int32, evs []rawEv) *calltrace.Matcher {
	t.Helper()
	m := calltrace.NewMatcher(sink)
	funcs := map[string]*calltrace.Function{}
	for _, e := range evs {
		f := funcs[e.fn]
		if f == nil {
			f = &calltrace.Function{Addr: uint64(len(funcs) + 1), Name: e.fn, Object: "/bin/app"}
			funcs[e.fn] = f
		}
		if err := m.Add(&calltrace.Event{Kind: e.kind, Thread: tid, TimeNs: e.ns, Func: f, Args: e.args, Ret: e.ret}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestTracerStack: the Chrome JSON writer on the irregularities real
// captures have (an exit whose entry preceded the capture, an exit that
// skips frames, a call still open at the end), repaired by the Matcher.
func TestTracerStack(t *testing.T) {
	tr := NewTracer(1)
	m := feed(t, tr, 7, []rawEv{
		{calltrace.Exit, 100, "a", nil, nil},   // began before the capture: unpaired
		{calltrace.Entry, 200, "b", nil, nil},  // b
		{calltrace.Entry, 300, "c", nil, nil},  //   c
		{calltrace.Entry, 400, "d", nil, nil},  //     d (never exits: longjmp)
		{calltrace.Exit, 900, "c", nil, nil},   //   c exits, closing d
		{calltrace.Entry, 1000, "e", nil, nil}, //   e (open at the end)
		{calltrace.Exit, 1100, "f", nil, nil},  // never entered: unpaired
	})
	if m.Unpaired != 2 || tr.Calls() != 4 {
		t.Fatalf("unpaired %d, calls %d; want 2 and 4", m.Unpaired, tr.Calls())
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
	// Timestamps are µs from the first call (200 ns).
	want := map[string][2]float64{
		"c": {0.1, 0.6}, "d": {0.2, 0.5}, // d closed by c's exit
		"e": {0.8, 0.1}, "b": {0, 0.9}, // open at the end: closed at the thread's last event
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

func iv(name string, n int64) calltrace.Value {
	return calltrace.Value{Name: name, Kind: calltrace.Int, Int: n}
}

func ret(n int64) *calltrace.Value { v := iv("", n); return &v }

// fibEvents is the call tree of fib(3) with its arguments and results.
func fibEvents() []rawEv {
	var evs []rawEv
	ns := uint64(1000)
	var fib func(n int64) int64
	fib = func(n int64) int64 {
		evs = append(evs, rawEv{calltrace.Entry, ns, "fib", []calltrace.Value{iv("n", n)}, nil})
		ns += 100
		r := n
		if n >= 2 {
			r = fib(n-1) + fib(n-2)
		}
		ns += 50
		evs = append(evs, rawEv{calltrace.Exit, ns, "fib", nil, ret(r)})
		return r
	}
	fib(3)
	return evs
}

const fibText = `# DURATION     TID     FUNCTION
            [    42] | fib(n=3) {
            [    42] |   fib(n=2) {
   0.150 us [    42] |     fib(n=1) = 1;
   0.150 us [    42] |     fib(n=0) = 0;
   0.450 us [    42] |   } = 1; /* fib */
   0.150 us [    42] |   fib(n=1) = 1;
   0.750 us [    42] | } = 2; /* fib */
`

// TestTextCallGraph: the text view of a recursive program's known call
// tree, leaf calls on one line, the others opened and closed.
func TestTextCallGraph(t *testing.T) {
	var buf bytes.Buffer
	feed(t, NewTextSink(&buf), 42, fibEvents())
	if buf.String() != fibText {
		t.Fatalf("got\n%s\nwant\n%s", buf.String(), fibText)
	}
}

// TestTextIrregular: unwound and still-running calls say so.
func TestTextIrregular(t *testing.T) {
	var buf bytes.Buffer
	feed(t, NewTextSink(&buf), 1, []rawEv{
		{calltrace.Entry, 0, "catcher", nil, nil},
		{calltrace.Entry, 10, "deep", nil, nil},
		{calltrace.Exit, 30, "catcher", nil, nil},
		{calltrace.Entry, 40, "loop", nil, nil},
	})
	want := `# DURATION     TID     FUNCTION
            [     1] | catcher() {
   0.020 us [     1] |   deep(); /* unwound: never returned (longjmp, exception) */
   0.030 us [     1] | } /* catcher */
  +0.000 us [     1] | loop(); /* still running when the capture ended */
`
	if buf.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", buf.String(), want)
	}
}

// TestPerfettoReplay: a call stream written as a Perfetto trace and
// replayed from it prints the same text view.
func TestPerfettoReplay(t *testing.T) {
	var pf bytes.Buffer
	ps, err := NewPerfettoSink(&pf, 5, "fib", nil)
	if err != nil {
		t.Fatal(err)
	}
	feed(t, ps, 42, fibEvents())
	if !strings.Contains(pf.String(), "fib") {
		t.Fatal("trace does not name fib")
	}
	var txt bytes.Buffer
	if err := ReplayPerfetto(&pf, NewTextSink(&txt)); err != nil {
		t.Fatal(err)
	}
	if txt.String() != fibText {
		t.Fatalf("replayed\n%s\nwant\n%s", txt.String(), fibText)
	}
}

// TestReplayHostileNames: a trace file whose function, argument and note
// texts carry terminal controls (a file another user wrote) replays with
// them escaped: the text view holds no control byte but its newlines.
func TestReplayHostileNames(t *testing.T) {
	evil := "ev\x1b]0;PWNED\x07il\x1b[2J\u202e"
	var pf bytes.Buffer
	ps, err := NewPerfettoSink(&pf, 5, "p", nil)
	if err != nil {
		t.Fatal(err)
	}
	feed(t, ps, 42, []rawEv{
		{calltrace.Entry, 100, evil, []calltrace.Value{{Name: evil, Kind: calltrace.Int, Int: 1}, {Name: "e", Kind: calltrace.Enum, Str: evil}}, nil},
		{calltrace.Entry, 150, "leaf", nil, nil},
		{calltrace.Exit, 160, "leaf", nil, nil},
		{calltrace.Exit, 200, evil, nil, &calltrace.Value{Kind: calltrace.String, Uint: 1, Str: evil}},
	})
	var txt bytes.Buffer
	if err := ReplayPerfetto(&pf, NewTextSink(&txt)); err != nil {
		t.Fatal(err)
	}
	for i, c := range txt.Bytes() {
		if c < 0x20 && c != '\n' || c == 0x7f {
			t.Fatalf("byte %d of the replay is %#x:\n%q", i, c, txt.String())
		}
	}
	if want := calltrace.Printable(evil); strings.Count(txt.String(), want) < 3 {
		t.Fatalf("the replay does not show the escaped name %s three times:\n%s", want, txt.String())
	}
}

// TestUnloadedInEveryFormat: an object the process unloaded during a
// capture (calltrace.Unloaded, D80) is in every format: an "object
// unloaded" instant of the process in Chrome JSON (its "object" argument)
// and in Perfetto (replayed as the same line), a line in the text view.
// The Matcher passes it on without touching any thread's calls: the call
// still open at the end ends at its own thread's last event, not at the
// unload's time.
func TestUnloadedInEveryFormat(t *testing.T) {
	const obj = "/opt/plug.so"
	a := &calltrace.Function{Addr: 1, Name: "a", Object: "/bin/app"}
	evs := []calltrace.Event{
		{Kind: calltrace.Entry, Thread: 7, TimeNs: 100, Func: a},
		{Kind: calltrace.Entry, Thread: 7, TimeNs: 120, Func: a},
		{Kind: calltrace.Exit, Thread: 7, TimeNs: 140, Func: a},
		{Kind: calltrace.Unloaded, Thread: 7, TimeNs: 900, Func: &calltrace.Function{Object: obj}},
	}
	play := func(sink calltrace.Sink) *calltrace.Matcher {
		m := calltrace.NewMatcher(sink)
		for i := range evs {
			e := evs[i]
			if err := m.Add(&e); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		return m
	}
	line := "/* the process unloaded " + obj + " here: its probes went with it */"

	tr := NewTracer(7)
	if m := play(tr); m.Open != 1 || m.Calls != 2 {
		t.Fatalf("matcher: open %d calls %d; want 1 and 2", m.Open, m.Calls)
	}
	var js bytes.Buffer
	if err := tr.Write(&js); err != nil {
		t.Fatal(err)
	}
	var doc struct{ TraceEvents []traceEvent }
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, e := range doc.TraceEvents {
		switch {
		case e.Name == unloadedName:
			if e.Ph != "i" || e.S != "p" || e.Args["object"] != obj || e.Pid != 7 {
				t.Errorf("chrome-json unloaded event %+v", e)
			}
			found++
		case e.Ph == "X" && e.Name == "a" && e.Dur != nil && *e.Dur > 0.0401:
			t.Errorf("the open call ends %.3f µs after it began: at the unload, not at its thread's last event", *e.Dur)
		}
	}
	if found != 1 {
		t.Errorf("chrome-json: %d unloaded events; want 1:\n%s", found, js.String())
	}

	var txt bytes.Buffer
	play(NewTextSink(&txt))
	if !strings.Contains(txt.String(), line) {
		t.Errorf("text view:\n%s\nwant the line %q", txt.String(), line)
	}

	var pf bytes.Buffer
	ps, err := NewPerfettoSink(&pf, 7, "app", nil)
	if err != nil {
		t.Fatal(err)
	}
	play(ps)
	var rep bytes.Buffer
	if err := ReplayPerfetto(&pf, NewTextSink(&rep)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rep.String(), line) || !strings.Contains(rep.String(), "a() {") {
		t.Errorf("replayed Perfetto trace:\n%s\nwant a's calls and the line %q", rep.String(), line)
	}
}
