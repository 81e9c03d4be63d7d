package perfetto

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// ErrFormat means the input is not a trace this package can read.
var ErrFormat = errors.New("not a Perfetto trace")

// EventType is a TrackEvent's type.
type EventType uint8

// Event types.
const (
	SliceBegin EventType = typeSliceBegin
	SliceEnd   EventType = typeSliceEnd
	InstantEv  EventType = typeInstant
)

// Track is a process or thread track.
type Track struct {
	UUID, Parent uint64
	Pid, Tid     int32 // Tid is 0 for a process track
	Name         string
}

// Event is a decoded TrackEvent.
type Event struct {
	Type   EventType
	TimeNs uint64
	Track  *Track // nil if no descriptor named the event's track
	Name   string
	Args   []Arg
}

// MaxPacket bounds a packet the Reader accepts.
const MaxPacket = 64 << 20

// Reader decodes a trace as a stream.
type Reader struct {
	in      *bufio.Reader
	tracks  map[uint64]*Track
	seqs    map[uint64]*seqState
	buf     []byte
	Clocks  Clocks // the first ClockSnapshot's readings, if any
	Skipped uint64 // packets of other kinds, and events whose incremental state was lost
	Packets uint64
	offset  int64
}

type seqState struct {
	valid    bool
	names    map[uint64]string
	annNames map[uint64]string
	clock    uint64
}

// NewReader reads the trace r holds.
func NewReader(r io.Reader) *Reader {
	return &Reader{in: bufio.NewReaderSize(r, 1<<16), tracks: map[uint64]*Track{}, seqs: map[uint64]*seqState{}}
}

// Tracks returns the tracks described so far, by uuid.
func (r *Reader) Tracks() map[uint64]*Track { return r.tracks }

// Next returns the next track event, or io.EOF at the end of the trace.
// The Event and its Args are valid until the next call.
func (r *Reader) Next() (*Event, error) {
	for {
		pkt, err := r.packet()
		if err != nil {
			return nil, err
		}
		ev, err := r.decodePacket(pkt)
		if err != nil {
			return nil, fmt.Errorf("packet %d (byte %d): %w", r.Packets, r.offset, err)
		}
		if ev != nil {
			return ev, nil
		}
	}
}

func (r *Reader) packet() ([]byte, error) {
	tag, err := binaryUvarint(r.in)
	if err == io.EOF {
		return nil, io.EOF
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	num, typ := protowire.DecodeTag(tag)
	if num != fTracePacket || typ != protowire.BytesType {
		return nil, fmt.Errorf("%w: field %d type %d at byte %d, want packets (field 1)", ErrFormat, num, typ, r.offset)
	}
	n, err := binaryUvarint(r.in)
	if err != nil || n > MaxPacket {
		return nil, fmt.Errorf("%w: bad packet length at byte %d", ErrFormat, r.offset)
	}
	if cap(r.buf) < int(n) {
		r.buf = make([]byte, n)
	}
	r.buf = r.buf[:n]
	if _, err := io.ReadFull(r.in, r.buf); err != nil {
		return nil, fmt.Errorf("%w: truncated packet at byte %d", ErrFormat, r.offset)
	}
	r.offset += int64(n)
	r.Packets++
	return r.buf, nil
}

func binaryUvarint(r io.ByteReader) (uint64, error) {
	var x uint64
	for shift := uint(0); shift < 64; shift += 7 {
		b, err := r.ReadByte()
		if err != nil {
			if shift > 0 && err == io.EOF {
				return 0, io.ErrUnexpectedEOF
			}
			return 0, err
		}
		x |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return x, nil
		}
	}
	return 0, errors.New("varint overflows")
}

// fields calls fn for each field of message b.
func fields(b []byte, fn func(num protowire.Number, typ protowire.Type, v uint64, sub []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var (
			v   uint64
			sub []byte
		)
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.Fixed64Type:
			v, n = protowire.ConsumeFixed64(b)
		case protowire.Fixed32Type:
			var v32 uint32
			v32, n = protowire.ConsumeFixed32(b)
			v = uint64(v32)
		case protowire.BytesType:
			sub, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(num, typ, v, sub); err != nil {
			return err
		}
	}
	return nil
}

func (r *Reader) decodePacket(pkt []byte) (*Event, error) {
	var (
		ts, seqID, flags uint64
		te, td, id, snap []byte
		defaults         []byte
		hasClockID       bool
		clockID          uint64
	)
	err := fields(pkt, func(num protowire.Number, _ protowire.Type, v uint64, sub []byte) error {
		switch num {
		case fPktTimestamp:
			ts = v
		case fPktTrustedSequenceID:
			seqID = v
		case fPktSequenceFlags:
			flags = v
		case fPktTrackEvent:
			te = sub
		case fPktTrackDescriptor:
			td = sub
		case fPktInternedData:
			id = sub
		case fPktClockSnapshot:
			snap = sub
		case fPktTracePacketDefaults:
			defaults = sub
		case 58: // TracePacket.timestamp_clock_id
			hasClockID, clockID = true, v
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	seq := r.seqs[seqID]
	if seq == nil {
		seq = &seqState{names: map[uint64]string{}, annNames: map[uint64]string{}}
		r.seqs[seqID] = seq
	}
	if flags&seqIncrementalStateCleared != 0 {
		seq.valid = true
		seq.names, seq.annNames, seq.clock = map[uint64]string{}, map[uint64]string{}, 0
	}
	if defaults != nil {
		if err := fields(defaults, func(num protowire.Number, _ protowire.Type, v uint64, _ []byte) error {
			if num == fDefTimestampClockID {
				seq.clock = v
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	if snap != nil && r.Clocks == (Clocks{}) {
		if err := r.clockSnapshot(snap); err != nil {
			return nil, err
		}
	}
	if td != nil {
		return nil, r.trackDescriptor(td)
	}
	if te == nil {
		r.Skipped++
		return nil, nil
	}
	if flags&seqNeedsIncrementalState != 0 && !seq.valid {
		r.Skipped++ // its interned names were lost with the packets before it
		return nil, nil
	}
	if id != nil {
		if err := internedData(id, seq); err != nil {
			return nil, err
		}
	}
	clock := seq.clock
	if hasClockID {
		clock = clockID
	}
	if clock != 0 && clock != clockMonotonic {
		return nil, fmt.Errorf("timestamps in clock %d: only CLOCK_MONOTONIC (3) traces are read", clock)
	}
	return r.trackEvent(te, ts, seq)
}

func (r *Reader) clockSnapshot(b []byte) error {
	return fields(b, func(num protowire.Number, _ protowire.Type, _ uint64, sub []byte) error {
		if num != fSnapClocks {
			return nil
		}
		var id, ts uint64
		if err := fields(sub, func(num protowire.Number, _ protowire.Type, v uint64, _ []byte) error {
			switch num {
			case fClockID:
				id = v
			case fClockTimestamp:
				ts = v
			}
			return nil
		}); err != nil {
			return err
		}
		switch id {
		case clockMonotonic:
			r.Clocks.MonotonicNs = ts
		case clockBoottime:
			r.Clocks.BoottimeNs = ts
		}
		return nil
	})
}

func (r *Reader) trackDescriptor(b []byte) error {
	t := &Track{}
	err := fields(b, func(num protowire.Number, _ protowire.Type, v uint64, sub []byte) error {
		switch num {
		case fTDUUID:
			t.UUID = v
		case fTDParentUUID:
			t.Parent = v
		case fTDName:
			t.Name = string(sub)
		case fTDProcess, fTDThread:
			thread := num == fTDThread
			return fields(sub, func(num protowire.Number, _ protowire.Type, v uint64, s []byte) error {
				switch {
				case num == fProcPid: // == fThrPid
					t.Pid = int32(v)
				case thread && num == fThrTid:
					t.Tid = int32(v)
				case thread && num == fThrName, !thread && num == fProcName:
					if t.Name == "" {
						t.Name = string(s)
					}
				}
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return err
	}
	r.tracks[t.UUID] = t
	return nil
}

func internedData(b []byte, seq *seqState) error {
	return fields(b, func(num protowire.Number, _ protowire.Type, _ uint64, sub []byte) error {
		var table map[uint64]string
		switch num {
		case fIDEventNames:
			table = seq.names
		case fIDAnnotationNames:
			table = seq.annNames
		default:
			return nil
		}
		var iid uint64
		var name string
		if err := fields(sub, func(num protowire.Number, _ protowire.Type, v uint64, s []byte) error {
			switch num {
			case fInternIID:
				iid = v
			case fInternName:
				name = string(s)
			}
			return nil
		}); err != nil {
			return err
		}
		table[iid] = name
		return nil
	})
}

func (r *Reader) trackEvent(b []byte, ts uint64, seq *seqState) (*Event, error) {
	ev := &Event{TimeNs: ts}
	var track uint64
	err := fields(b, func(num protowire.Number, _ protowire.Type, v uint64, sub []byte) error {
		switch num {
		case fTEType:
			ev.Type = EventType(v)
		case fTETrackUUID:
			track = v
		case fTENameIID:
			var err error
			ev.Name, err = interned(seq.names, v, "event name")
			return err
		case fTEName:
			ev.Name = string(sub)
		case fTEDebugAnnotations:
			a, err := annotation(sub, seq, 0)
			if err != nil {
				return err
			}
			ev.Args = append(ev.Args, a)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	ev.Track = r.tracks[track]
	return ev, nil
}

// interned looks an iid up in one of the sequence's interning tables.
func interned(table map[uint64]string, iid uint64, what string) (string, error) {
	s, ok := table[iid]
	if !ok {
		return "", fmt.Errorf("%s iid %d was never interned", what, iid)
	}
	return s, nil
}

func annotation(b []byte, seq *seqState, depth int) (Arg, error) {
	var a Arg
	if depth > 32 {
		return a, errors.New("debug annotations nested too deep")
	}
	err := fields(b, func(num protowire.Number, _ protowire.Type, v uint64, sub []byte) error {
		switch num {
		case fDANameIID:
			var err error
			a.Name, err = interned(seq.annNames, v, "annotation name")
			return err
		case fDAName:
			a.Name = string(sub)
		case fDABool:
			a.Kind, a.Uint = ArgBool, v
		case fDAUint:
			a.Kind, a.Uint = ArgUint, v
		case fDAInt:
			a.Kind, a.Int = ArgInt, int64(v)
		case fDADouble:
			a.Kind, a.Double = ArgDouble, math.Float64frombits(v)
		case fDAString:
			a.Kind, a.Str = ArgString, string(sub)
		case fDAPointer:
			a.Kind, a.Uint = ArgPointer, v
		case fDADictEntries:
			d, err := annotation(sub, seq, depth+1)
			if err != nil {
				return err
			}
			a.Kind = ArgDict
			a.Dict = append(a.Dict, d)
		}
		return nil
	})
	return a, err
}
