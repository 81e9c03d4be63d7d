package perfetto

import (
	"bufio"
	"io"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// ArgKind says which field of an Arg holds its value.
type ArgKind uint8

// Argument kinds, one per DebugAnnotation value field used.
const (
	ArgInt ArgKind = iota + 1
	ArgUint
	ArgBool
	ArgDouble
	ArgString
	ArgPointer
	ArgDict // Dict holds the members
)

// Arg is one named argument of an event (a DebugAnnotation).
type Arg struct {
	Name   string
	Kind   ArgKind
	Int    int64
	Uint   uint64 // ArgUint, ArgPointer, ArgBool (0 or 1)
	Double float64
	Str    string
	Dict   []Arg
}

// Clocks is a reading of the clocks the trace's timestamps relate to,
// taken together, so a reader can put them on one timeline.
type Clocks struct {
	MonotonicNs, BoottimeNs uint64
}

// MaxInterned is how many names a Writer keeps interned before it clears
// the sequence's incremental state and starts again (names are then
// re-emitted with new ids), so memory stays bounded whatever the input.
const MaxInterned = 1 << 16

// Writer encodes a trace as a stream. Its methods are not safe for
// concurrent use. Timestamps are CLOCK_MONOTONIC nanoseconds.
type Writer struct {
	out      *bufio.Writer
	seq      uint32
	names    map[string]uint64 // event names -> iid
	annNames map[string]uint64 // debug annotation names -> iid
	nextIID  uint64            // iids are never reused, even after a clear
	cleared  bool              // the next packet must clear incremental state
	pkt, te  []byte            // reused encoding buffers
	interned []byte
	hdr      []byte
	newNames []internEntry
	newAnns  []internEntry
	err      error
	// Packets and Bytes count what has been written.
	Packets, Bytes uint64
	// Clears counts how many times the interning state was cleared.
	Clears int
}

type internEntry struct {
	iid  uint64
	name string
}

// NewWriter starts a trace on w, with one packet sequence. If clocks is
// not nil, a ClockSnapshot relating CLOCK_MONOTONIC to CLOCK_BOOTTIME
// (Perfetto's default trace clock) goes first.
func NewWriter(w io.Writer, clocks *Clocks) *Writer {
	tw := &Writer{out: bufio.NewWriterSize(w, 1<<16), seq: 1, cleared: true}
	tw.reset()
	if clocks != nil {
		var cs []byte
		for _, c := range []struct {
			id uint64
			ns uint64
		}{{clockBoottime, clocks.BoottimeNs}, {clockMonotonic, clocks.MonotonicNs}} {
			var clk []byte
			clk = protowire.AppendTag(clk, fClockID, protowire.VarintType)
			clk = protowire.AppendVarint(clk, c.id)
			clk = protowire.AppendTag(clk, fClockTimestamp, protowire.VarintType)
			clk = protowire.AppendVarint(clk, c.ns)
			cs = appendMsg(cs, fSnapClocks, clk)
		}
		p := appendMsg(nil, fPktClockSnapshot, cs)
		p = protowire.AppendTag(p, fPktTrustedSequenceID, protowire.VarintType)
		p = protowire.AppendVarint(p, uint64(tw.seq))
		tw.emit(p)
	}
	return tw
}

func (w *Writer) reset() {
	w.names = map[string]uint64{}
	w.annNames = map[string]uint64{}
}

func appendMsg(b []byte, num protowire.Number, body []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, body)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// emit writes one packet as field 1 of the Trace message.
func (w *Writer) emit(p []byte) {
	if w.err != nil {
		return
	}
	h := protowire.AppendTag(w.hdr[:0], fTracePacket, protowire.BytesType)
	h = protowire.AppendVarint(h, uint64(len(p)))
	w.hdr = h
	if _, w.err = w.out.Write(h); w.err == nil {
		_, w.err = w.out.Write(p)
	}
	w.Packets++
	w.Bytes += uint64(len(h) + len(p))
}

// header starts a packet of the sequence: sequence id and flags, with the
// defaults re-emitted after a clear.
func (w *Writer) header(p []byte, needsState bool) []byte {
	p = appendVarint(p, fPktTrustedSequenceID, uint64(w.seq))
	flags := uint64(0)
	if w.cleared {
		flags |= seqIncrementalStateCleared
		var def []byte
		def = appendVarint(def, fDefTimestampClockID, clockMonotonic)
		p = appendMsg(p, fPktTracePacketDefaults, def)
		w.cleared = false
		needsState = true
	}
	if needsState {
		flags |= seqNeedsIncrementalState
	}
	return appendVarint(p, fPktSequenceFlags, flags)
}

// Process describes the track of process pid.
func (w *Writer) Process(uuid uint64, pid int32, name string) error {
	var pd []byte
	pd = appendVarint(pd, fProcPid, uint64(uint32(pid)))
	if name != "" {
		pd = appendString(pd, fProcName, name)
	}
	return w.track(uuid, 0, fTDProcess, pd)
}

// Thread describes the track of thread tid of process pid, under the
// process's track parent.
func (w *Writer) Thread(uuid, parent uint64, pid, tid int32, name string) error {
	var td []byte
	td = appendVarint(td, fThrPid, uint64(uint32(pid)))
	td = appendVarint(td, fThrTid, uint64(uint32(tid)))
	if name != "" {
		td = appendString(td, fThrName, name)
	}
	return w.track(uuid, parent, fTDThread, td)
}

func (w *Writer) track(uuid, parent uint64, kind protowire.Number, desc []byte) error {
	var t []byte
	t = appendVarint(t, fTDUUID, uuid)
	if parent != 0 {
		t = appendVarint(t, fTDParentUUID, parent)
	}
	t = appendMsg(t, kind, desc)
	p := w.header(w.pkt[:0], false)
	p = appendMsg(p, fPktTrackDescriptor, t)
	w.pkt = p
	w.emit(p)
	return w.err
}

// Begin opens a slice named name on track at ts.
func (w *Writer) Begin(ts, track uint64, name string, args []Arg) error {
	return w.event(typeSliceBegin, ts, track, name, args)
}

// End closes the innermost open slice of track at ts; args are merged into
// the slice's.
func (w *Writer) End(ts, track uint64, args []Arg) error {
	return w.event(typeSliceEnd, ts, track, "", args)
}

// Instant marks a point event on track at ts.
func (w *Writer) Instant(ts, track uint64, name string, args []Arg) error {
	return w.event(typeInstant, ts, track, name, args)
}

func (w *Writer) event(typ uint64, ts, track uint64, name string, args []Arg) error {
	if w.err != nil {
		return w.err
	}
	if len(w.names)+len(w.annNames) >= MaxInterned {
		w.reset()
		w.cleared = true
		w.Clears++
	}
	w.newNames, w.newAnns = w.newNames[:0], w.newAnns[:0]
	te := appendVarint(w.te[:0], fTEType, typ)
	te = appendVarint(te, fTETrackUUID, track)
	if name != "" {
		te = appendVarint(te, fTENameIID, w.intern(w.names, &w.newNames, name))
	}
	for i := range args {
		te = appendMsg(te, fTEDebugAnnotations, w.annotation(nil, &args[i]))
	}
	w.te = te
	p := w.header(w.pkt[:0], true)
	p = appendVarint(p, fPktTimestamp, ts)
	if len(w.newNames)+len(w.newAnns) > 0 {
		id := w.interned[:0]
		for _, e := range w.newNames {
			id = appendMsg(id, fIDEventNames, internMsg(e))
		}
		for _, e := range w.newAnns {
			id = appendMsg(id, fIDAnnotationNames, internMsg(e))
		}
		w.interned = id
		p = appendMsg(p, fPktInternedData, id)
	}
	p = appendMsg(p, fPktTrackEvent, te)
	w.pkt = p
	w.emit(p)
	return w.err
}

func internMsg(e internEntry) []byte {
	var m []byte
	m = appendVarint(m, fInternIID, e.iid)
	return appendString(m, fInternName, e.name)
}

func (w *Writer) intern(table map[string]uint64, fresh *[]internEntry, s string) uint64 {
	if iid, ok := table[s]; ok {
		return iid
	}
	w.nextIID++
	table[s] = w.nextIID
	*fresh = append(*fresh, internEntry{w.nextIID, s})
	return w.nextIID
}

// annotation encodes a as a DebugAnnotation message body.
func (w *Writer) annotation(b []byte, a *Arg) []byte {
	b = appendVarint(b, fDANameIID, w.intern(w.annNames, &w.newAnns, a.Name))
	switch a.Kind {
	case ArgInt:
		b = appendVarint(b, fDAInt, uint64(a.Int))
	case ArgUint:
		b = appendVarint(b, fDAUint, a.Uint)
	case ArgBool:
		b = appendVarint(b, fDABool, a.Uint&1)
	case ArgDouble:
		b = protowire.AppendTag(b, fDADouble, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, math.Float64bits(a.Double))
	case ArgString:
		b = appendString(b, fDAString, a.Str)
	case ArgPointer:
		b = appendVarint(b, fDAPointer, a.Uint)
	case ArgDict:
		for i := range a.Dict {
			b = appendMsg(b, fDADictEntries, w.annotation(nil, &a.Dict[i]))
		}
	}
	return b
}

// Flush writes what is buffered.
func (w *Writer) Flush() error {
	if w.err != nil {
		return w.err
	}
	return w.out.Flush()
}
