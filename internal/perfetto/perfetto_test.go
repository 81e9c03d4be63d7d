package perfetto

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

const (
	procUUID = 1 << 62
	pid      = 4242
)

func threadUUID(tid int32) uint64 { return procUUID | uint64(tid) }

var sampleArgs = []Arg{
	{Name: "n", Kind: ArgInt, Int: -7},
	{Name: "len", Kind: ArgUint, Uint: 512},
	{Name: "ok", Kind: ArgBool, Uint: 1},
	{Name: "x", Kind: ArgDouble, Double: 2.5},
	{Name: "s", Kind: ArgString, Str: "hi"},
	{Name: "req", Kind: ArgPointer, Uint: 0x7f3a0010},
	{Name: "p", Kind: ArgDict, Dict: []Arg{{Name: "x", Kind: ArgInt, Int: 1}, {Name: "y", Kind: ArgDouble, Double: -0.5}}},
}

// writeSample writes a small trace: a process, two threads, nested slices
// with every kind of argument, an instant and a return value on an end.
func writeSample(t *testing.T, w io.Writer) *Writer {
	t.Helper()
	tw := NewWriter(w, &Clocks{MonotonicNs: 1000, BoottimeNs: 5000})
	must(t, tw.Process(procUUID, pid, "service"))
	for _, tid := range []int32{101, 102} {
		must(t, tw.Thread(threadUUID(tid), procUUID, pid, tid, fmt.Sprintf("thread %d", tid)))
	}
	must(t, tw.Begin(2000, threadUUID(101), "handle_request", sampleArgs))
	must(t, tw.Begin(2100, threadUUID(101), "lookup", nil))
	must(t, tw.Begin(2150, threadUUID(102), "lookup", nil))
	must(t, tw.End(2200, threadUUID(101), []Arg{{Name: "return", Kind: ArgInt, Int: 0}}))
	must(t, tw.Instant(2300, threadUUID(101), "bare_entry", nil))
	must(t, tw.End(2400, threadUUID(102), nil))
	must(t, tw.End(2500, threadUUID(101), nil))
	must(t, tw.Flush())
	return tw
}

// sampleFile writes the sample trace to a file and returns its path.
func sampleFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trace.pftrace")
	f, err := os.Create(path)
	must(t, err)
	writeSample(t, f)
	must(t, f.Close())
	return path
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	writeSample(t, &buf)
	r := NewReader(&buf)
	type ev struct {
		Type EventType
		Ts   uint64
		Tid  int32
		Name string
		Args []Arg
	}
	var got []ev
	for {
		e, err := r.Next()
		if err == io.EOF {
			break
		}
		must(t, err)
		got = append(got, ev{e.Type, e.TimeNs, e.Track.Tid, e.Name, append([]Arg(nil), e.Args...)})
	}
	want := []ev{
		{SliceBegin, 2000, 101, "handle_request", sampleArgs},
		{SliceBegin, 2100, 101, "lookup", nil},
		{SliceBegin, 2150, 102, "lookup", nil},
		{SliceEnd, 2200, 101, "", []Arg{{Name: "return", Kind: ArgInt, Int: 0}}},
		{InstantEv, 2300, 101, "bare_entry", nil},
		{SliceEnd, 2400, 102, "", nil},
		{SliceEnd, 2500, 101, "", nil},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read back\n%+v\nwant\n%+v", got, want)
	}
	if r.Clocks != (Clocks{MonotonicNs: 1000, BoottimeNs: 5000}) {
		t.Errorf("clocks %+v", r.Clocks)
	}
	if tr := r.Tracks()[threadUUID(102)]; tr == nil || tr.Pid != pid || tr.Name != "thread 102" || tr.Parent != procUUID {
		t.Errorf("thread track %+v", tr)
	}
	if tr := r.Tracks()[procUUID]; tr == nil || tr.Pid != pid || tr.Tid != 0 || tr.Name != "service" {
		t.Errorf("process track %+v", tr)
	}
}

// TestProtocDecodesWithPerfettoSchema decodes a trace with protoc and the
// published definitions of the fields we use: every field must be known to
// Perfetto's schema under the name and type we meant.
func TestProtocDecodesWithPerfettoSchema(t *testing.T) {
	testutil.RequireTool(t, "protoc")
	path := sampleFile(t)
	text := protoc(t, path, "--proto_path=testdata", "--decode=perfetto.protos.Trace", "perfetto_subset.proto")
	for _, line := range strings.Split(text, "\n") {
		if l := strings.TrimSpace(line); l != "" && l[0] >= '0' && l[0] <= '9' {
			t.Errorf("field unknown to Perfetto's schema: %q", l)
		}
	}
	for _, want := range []string{
		"clock_snapshot {", "clock_id: 6", "timestamp: 5000", "clock_id: 3",
		"trusted_packet_sequence_id: 1", "sequence_flags: 3", "trace_packet_defaults {", "timestamp_clock_id: 3",
		"track_descriptor {", "uuid: 4611686018427387904", "process {", "pid: 4242", `process_name: "service"`,
		"parent_uuid: 4611686018427387904", "thread {", "tid: 102", `thread_name: "thread 101"`,
		"timestamp: 2000", "track_event {", "type: TYPE_SLICE_BEGIN", "type: TYPE_SLICE_END", "type: TYPE_INSTANT",
		"track_uuid: 4611686018427388005", "name_iid: 1", "interned_data {", "event_names {", `name: "handle_request"`,
		"debug_annotation_names {", `name: "len"`, "debug_annotations {", "int_value: -7", "uint_value: 512",
		"bool_value: true", "double_value: 2.5", `string_value: "hi"`, "pointer_value: 2134507536", "dict_entries {", "double_value: -0.5",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("protoc's decoding lacks %q:\n%s", want, text)
		}
	}
}

// TestProtocDecodeRaw checks the encoding by field numbers with a decoder
// that knows no schema: the numbers of Perfetto's protos, nested as they
// nest there.
func TestProtocDecodeRaw(t *testing.T) {
	testutil.RequireTool(t, "protoc")
	path := sampleFile(t)
	root := parseRaw(t, protoc(t, path, "--decode_raw"))
	pkts := root.all("1")
	if len(pkts) != 11 { // clock snapshot, 3 track descriptors, 7 events
		t.Fatalf("%d packets, want 11", len(pkts))
	}
	// ClockSnapshot (6): clocks (1) {clock_id (1), timestamp (2)}.
	if c := pkts[0].one(t, "6").all("1"); len(c) != 2 || c[0].val(t, "1") != "6" || c[0].val(t, "2") != "5000" || c[1].val(t, "1") != "3" {
		t.Errorf("clock snapshot %v", pkts[0])
	}
	// The first descriptor clears incremental state (13: 1, with
	// TracePacketDefaults 59 {timestamp_clock_id 58: MONOTONIC 3}).
	p := pkts[1]
	if p.val(t, "10") != "1" || p.val(t, "13") != "3" || p.one(t, "59").val(t, "58") != "3" {
		t.Errorf("first sequence packet %v", p)
	}
	// TrackDescriptor (60): uuid (1), process (3) {pid (1), process_name (6)}.
	if td := p.one(t, "60"); td.val(t, "1") != "4611686018427387904" || td.one(t, "3").val(t, "1") != "4242" || td.one(t, "3").val(t, "6") != `"service"` {
		t.Errorf("process descriptor %v", td)
	}
	// Thread: parent_uuid (5), thread (4) {pid 1, tid 2, thread_name 5}.
	if td := pkts[2].one(t, "60"); td.val(t, "5") != "4611686018427387904" || td.one(t, "4").val(t, "2") != "101" || td.one(t, "4").val(t, "5") != `"thread 101"` {
		t.Errorf("thread descriptor %v", td)
	}
	// A slice begin: timestamp (8), sequence flags 2, interned_data (12)
	// {event_names (2) {iid 1, name 2}, debug_annotation_names (3)},
	// track_event (11) {type (9) 1, track_uuid (11), name_iid (10),
	// debug_annotations (4) {name_iid (1), int_value (4), ...}}.
	b := pkts[4]
	if b.val(t, "8") != "2000" || b.val(t, "13") != "2" {
		t.Errorf("begin packet %v", b)
	}
	if n := b.one(t, "12").one(t, "2"); n.val(t, "1") != "1" || n.val(t, "2") != `"handle_request"` {
		t.Errorf("interned name %v", n)
	}
	if n := len(b.one(t, "12").all("3")); n != 8 { // 7 arguments, and "y" of the dict ("x" is interned already)
		t.Errorf("%d interned annotation names, want 8: %v", n, b.one(t, "12").all("3"))
	}
	te := b.one(t, "11")
	if te.val(t, "9") != "1" || te.val(t, "11") != "4611686018427388005" || te.val(t, "10") != "1" {
		t.Errorf("track event %v", te)
	}
	anns := te.all("4")
	if len(anns) != len(sampleArgs) {
		t.Fatalf("%d annotations, want %d", len(anns), len(sampleArgs))
	}
	// int_value 4, uint_value 3, bool_value 2, double_value 5, string_value
	// 6, pointer_value 7, dict_entries 11.
	for i, field := range []string{"4", "3", "2", "5", "6", "7", "11"} {
		if !anns[i].has(field) {
			t.Errorf("annotation %s: no field %s: %v", sampleArgs[i].Name, field, anns[i])
		}
	}
	if e := pkts[7].one(t, "11"); e.val(t, "9") != "2" || len(e.all("10")) != 0 {
		t.Errorf("slice end %v", e)
	}
	if e := pkts[8].one(t, "11"); e.val(t, "9") != "3" {
		t.Errorf("instant %v", e)
	}
}

func protoc(t *testing.T, path string, args ...string) string {
	t.Helper()
	in, err := os.Open(path)
	must(t, err)
	defer in.Close()
	cmd := exec.Command("protoc", args...)
	cmd.Stdin = in
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("protoc %v: %v: %s", args, err, errb.String())
	}
	return out.String()
}

// raw is protoc --decode_raw's output as a tree.
type raw struct {
	fields []rawField
}

type rawField struct {
	num string
	val string
	sub *raw
}

func (r *raw) all(num string) []*raw {
	var out []*raw
	for _, f := range r.fields {
		if f.num == num && f.sub != nil {
			out = append(out, f.sub)
		}
	}
	return out
}

func (r *raw) has(num string) bool {
	for _, f := range r.fields {
		if f.num == num {
			return true
		}
	}
	return false
}

func (r *raw) one(t *testing.T, num string) *raw {
	t.Helper()
	if a := r.all(num); len(a) == 1 {
		return a[0]
	}
	t.Fatalf("want one message field %s in %v", num, r)
	return nil
}

func (r *raw) val(t *testing.T, num string) string {
	t.Helper()
	for _, f := range r.fields {
		if f.num == num && f.sub == nil {
			return f.val
		}
	}
	return "<no field " + num + ">"
}

func (r *raw) String() string {
	var b strings.Builder
	for _, f := range r.fields {
		if f.sub != nil {
			fmt.Fprintf(&b, "%s {%v} ", f.num, f.sub)
		} else {
			fmt.Fprintf(&b, "%s: %s ", f.num, f.val)
		}
	}
	return b.String()
}

func parseRaw(t *testing.T, text string) *raw {
	t.Helper()
	root := &raw{}
	stack := []*raw{root}
	for _, line := range strings.Split(text, "\n") {
		l := strings.TrimSpace(line)
		switch {
		case l == "":
		case l == "}":
			stack = stack[:len(stack)-1]
		case strings.HasSuffix(l, " {"):
			sub := &raw{}
			top := stack[len(stack)-1]
			top.fields = append(top.fields, rawField{num: strings.TrimSuffix(l, " {"), sub: sub})
			stack = append(stack, sub)
		default:
			num, val, ok := strings.Cut(l, ": ")
			if !ok {
				t.Fatalf("protoc output line %q", l)
			}
			top := stack[len(stack)-1]
			top.fields = append(top.fields, rawField{num: num, val: val})
		}
	}
	return root
}

// TestMillionsOfEvents writes two million events (a million calls on 16
// threads, some with arguments) to a file, then has protoc --decode_raw and
// our reader decode all of it: both must see every event, and the writer's
// memory must stay small however many events pass through it.
func TestMillionsOfEvents(t *testing.T) {
	testutil.RequireTool(t, "protoc")
	const calls = 1_000_000
	path := filepath.Join(t.TempDir(), "big.pftrace")
	f, err := os.Create(path)
	must(t, err)
	w := NewWriter(f, nil)
	must(t, w.Process(procUUID, pid, "big"))
	for tid := int32(1); tid <= 16; tid++ {
		must(t, w.Thread(threadUUID(tid), procUUID, pid, tid, ""))
	}
	peak := writeCalls(t, w, calls)
	must(t, w.Flush())
	must(t, f.Close())
	st, _ := os.Stat(path)
	t.Logf("%d events in %d packets, %d bytes; writer heap peak %d KiB", 2*calls, w.Packets, st.Size(), peak>>10)
	if peak > 16<<20 {
		t.Errorf("heap grew to %d MiB while writing", peak>>20)
	}

	// protoc --decode_raw, streamed: count the track events (field 11 of
	// the top-level packets) and their types.
	in, err := os.Open(path)
	must(t, err)
	defer in.Close()
	cmd := exec.Command("protoc", "--decode_raw")
	cmd.Stdin = in
	out, err := cmd.StdoutPipe()
	must(t, err)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	must(t, cmd.Start())
	sc := bufio.NewScanner(out)
	depth, events, begins, ends := 0, 0, 0, 0
	inEvent := false
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasSuffix(l, "{"):
			depth++
			if depth == 2 && l == "11 {" {
				events++
				inEvent = true
			}
		case l == "}":
			if depth == 2 {
				inEvent = false
			}
			depth--
		case inEvent && depth == 2 && l == "9: 1":
			begins++
		case inEvent && depth == 2 && l == "9: 2":
			ends++
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("protoc --decode_raw: %v: %s", err, errb.String())
	}
	if events != 2*calls || begins != calls || ends != calls {
		t.Errorf("protoc saw %d events (%d begins, %d ends), want %d", events, begins, ends, 2*calls)
	}

	// Our reader: every event, every slice closed on its own thread.
	_, err = in.Seek(0, io.SeekStart)
	must(t, err)
	r := NewReader(in)
	open := map[int32]int{}
	n := 0
	for {
		e, err := r.Next()
		if err == io.EOF {
			break
		}
		must(t, err)
		n++
		switch e.Type {
		case SliceBegin:
			open[e.Track.Tid]++
		case SliceEnd:
			open[e.Track.Tid]--
			if open[e.Track.Tid] < 0 {
				t.Fatalf("thread %d: an end without a begin", e.Track.Tid)
			}
		}
	}
	if n != 2*calls {
		t.Errorf("reader saw %d events, want %d", n, 2*calls)
	}
}

// writeCalls writes n calls (begin, end) spread over 16 threads and 64
// function names, one in 8 with arguments and a return value, and returns
// the peak heap seen.
func writeCalls(t testing.TB, w *Writer, n int) (peak uint64) {
	names := make([]string, 64)
	for i := range names {
		names[i] = fmt.Sprintf("function_%02d", i)
	}
	args := []Arg{{Name: "n", Kind: ArgInt}, {Name: "s", Kind: ArgString, Str: "GET /index.html"}}
	ret := []Arg{{Name: "return", Kind: ArgInt}}
	var ms runtime.MemStats
	ts := uint64(1_000_000_000)
	for i := 0; i < n; i++ {
		track := threadUUID(int32(i%16 + 1))
		var a, r []Arg
		if i%8 == 0 {
			args[0].Int, ret[0].Int = int64(i), int64(-i)
			a, r = args, ret
		}
		if err := w.Begin(ts, track, names[i%64], a); err != nil {
			t.Fatal(err)
		}
		if err := w.End(ts+50, track, r); err != nil {
			t.Fatal(err)
		}
		ts += 100
		if i%(n/8) == 0 {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
		}
	}
	return peak
}

// TestTenMillionEventsBoundedMemory streams ten million events through the
// writer: the heap it uses must not depend on the number of events.
func TestTenMillionEventsBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	var cw countWriter
	w := NewWriter(&cw, nil)
	peak := writeCalls(t, w, 5_000_000)
	must(t, w.Flush())
	t.Logf("10M events: %d bytes, heap peak %d KiB", cw.n, peak>>10)
	if peak > 16<<20 {
		t.Errorf("heap grew to %d MiB", peak>>20)
	}
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// TestNoAllocationPerEvent: once names are interned, an event without
// arguments allocates nothing.
func TestNoAllocationPerEvent(t *testing.T) {
	w := NewWriter(io.Discard, nil)
	w.Begin(1, 1, "f", nil)
	w.End(2, 1, nil)
	if a := testing.AllocsPerRun(1000, func() {
		w.Begin(1, 1, "f", nil)
		w.End(2, 1, nil)
	}); a != 0 {
		t.Errorf("%v allocations per call", a)
	}
}

// TestInternReset: past MaxInterned distinct names the writer clears the
// sequence's incremental state and re-interns; the reader still names every
// event right.
func TestInternReset(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, nil)
	n := MaxInterned + 100
	for i := 0; i < n; i++ {
		must(t, w.Instant(uint64(i), 7, fmt.Sprintf("f%d", i%(MaxInterned+50)), nil))
	}
	must(t, w.Flush())
	if w.Clears != 1 {
		t.Fatalf("%d clears, want 1", w.Clears)
	}
	r := NewReader(&buf)
	for i := 0; i < n; i++ {
		e, err := r.Next()
		must(t, err)
		if want := fmt.Sprintf("f%d", i%(MaxInterned+50)); e.Name != want {
			t.Fatalf("event %d named %q, want %q", i, e.Name, want)
		}
	}
}

func BenchmarkWriterEvent(b *testing.B) {
	w := NewWriter(io.Discard, nil)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		w.Begin(uint64(i), 1, "function", nil)
	}
}

// FuzzReader: any input ends in events, io.EOF or an error, never a panic.
func FuzzReader(f *testing.F) {
	var buf bytes.Buffer
	tw := NewWriter(&buf, &Clocks{MonotonicNs: 1, BoottimeNs: 2})
	tw.Process(procUUID, pid, "p")
	tw.Thread(threadUUID(1), procUUID, pid, 1, "t")
	tw.Begin(10, threadUUID(1), "f", sampleArgs)
	tw.End(20, threadUUID(1), []Arg{{Name: "return", Kind: ArgInt, Int: 3}})
	tw.Flush()
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bytes.NewReader(data))
		for i := 0; i < 10000; i++ {
			if _, err := r.Next(); err != nil {
				return
			}
		}
	})
}
