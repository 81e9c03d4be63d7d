package calltrace

import (
	"fmt"
	"strings"
	"testing"
)

type record struct{ lines []string }

func (r *record) Event(e *Event) error {
	s := fmt.Sprintf("%d %s %s@%d", e.Thread, e.Kind, e.Func.Name, e.TimeNs)
	if e.Unwound {
		s += " unwound"
	}
	if e.Open {
		s += " open"
	}
	r.lines = append(r.lines, s)
	return nil
}
func (r *record) Close() error { r.lines = append(r.lines, "close"); return nil }

// TestMatcher feeds the irregularities real captures have: an exit whose
// entry preceded the capture, an exit that skips frames (longjmp), a call
// still open at the end, and two threads interleaved.
func TestMatcher(t *testing.T) {
	fn := map[string]*Function{}
	for i, n := range []string{"a", "b", "c", "d", "e", "f"} {
		fn[n] = &Function{Addr: uint64(0x10 * (i + 1)), Name: n}
	}
	r := &record{}
	m := NewMatcher(r)
	for _, ev := range []struct {
		tid  int32
		kind Kind
		name string
		ns   uint64
	}{
		{1, Exit, "a", 100},   // began before the capture: dropped
		{1, Entry, "b", 200},  // b
		{2, Entry, "f", 210},  // another thread
		{1, Entry, "c", 300},  //   c
		{1, Entry, "d", 400},  //     d (never exits: longjmp)
		{1, Exit, "c", 900},   //   c exits, closing d
		{1, Entry, "e", 1000}, //   e (open at the end)
		{2, Exit, "f", 1050},
		{1, Exit, "f", 1100}, // never entered on this thread: dropped
	} {
		if err := m.Add(&Event{Kind: ev.kind, Thread: ev.tid, TimeNs: ev.ns, Func: fn[ev.name]}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	want := `1 entry b@200
2 entry f@210
1 entry c@300
1 entry d@400
1 exit d@900 unwound
1 exit c@900
1 entry e@1000
2 exit f@1050
1 exit e@1100 open
1 exit b@1100 open
close`
	if got := strings.Join(r.lines, "\n"); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if m.Unpaired != 2 || m.Unwound != 1 || m.Open != 2 || m.Calls != 5 {
		t.Fatalf("unpaired %d unwound %d open %d calls %d; want 2 1 2 5", m.Unpaired, m.Unwound, m.Open, m.Calls)
	}
}

// TestMatcherDepthBound: recursion deeper than MaxDepth keeps memory
// bounded and still pairs every exit with its own entry.
func TestMatcherDepthBound(t *testing.T) {
	f := &Function{Addr: 1, Name: "rec"}
	var exits, entries int
	sink := sinkFunc(func(e *Event) {
		switch e.Kind {
		case Entry:
			entries++
		case Exit:
			exits++
		}
	})
	m := NewMatcher(sink)
	const n = MaxDepth + 100
	for i := 0; i < n; i++ {
		m.Add(&Event{Kind: Entry, Thread: 1, TimeNs: uint64(i), Func: f})
	}
	if m.Depth(1) != MaxDepth || m.TooDeep != 100 {
		t.Fatalf("depth %d, too deep %d", m.Depth(1), m.TooDeep)
	}
	for i := 0; i < n; i++ {
		m.Add(&Event{Kind: Exit, Thread: 1, TimeNs: uint64(n + i), Func: f})
	}
	m.Close()
	if entries != MaxDepth || exits != MaxDepth || m.Unpaired != 0 || m.Open != 0 {
		t.Fatalf("entries %d exits %d unpaired %d open %d", entries, exits, m.Unpaired, m.Open)
	}
}

type sinkFunc func(*Event)

func (f sinkFunc) Event(e *Event) error { f(e); return nil }
func (f sinkFunc) Close() error         { return nil }

func TestValueString(t *testing.T) {
	for _, c := range []struct {
		v    Value
		want string
	}{
		{Value{Kind: Int, Int: -3}, "-3"},
		{Value{Kind: Float, Float: 2.5}, "2.5"},
		{Value{Kind: Float, Float: float64(float32(0.1)), Float32: true}, "0.1"},
		{Value{Kind: Pointer, Uint: 0x7f00}, "0x7f00"},
		{Value{Kind: Pointer}, "NULL"},
		{Value{Kind: String, Uint: 1, Str: "a\"b"}, `"a\"b"`},
		{Value{Kind: String, Uint: 1, Str: "abc", Truncated: true}, `"abc"...`},
		{Value{Kind: String, Uint: 0x10, Note: "unreadable"}, "0x10 (unreadable)"},
		{Value{Kind: Char, Int: 'x'}, "'x'"},
		{Value{Kind: Enum, Int: 2, Str: "B"}, "B"},
		{Value{Kind: Missing, Note: "on the stack"}, "?(on the stack)"},
		{Value{Kind: Struct, Fields: []Value{{Name: "x", Kind: Int, Int: 1}, {Name: "y", Kind: Bool, Uint: 1}}}, "{x=1, y=true}"},
	} {
		if got := c.v.String(); got != c.want {
			t.Errorf("%+v: %s, want %s", c.v, got, c.want)
		}
	}
	if got := FormatCall("f", []Value{{Name: "n", Kind: Int, Int: 3}, {Name: "s", Kind: String, Uint: 1, Str: "x"}}); got != `f(n=3, s="x")` {
		t.Errorf("FormatCall: %s", got)
	}
}
