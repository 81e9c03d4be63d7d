package report

import (
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
	"github.com/edgeprobe/edgeprobe/internal/dwarfargs"
	"github.com/edgeprobe/edgeprobe/internal/perfetto"
)

// PerfettoSink writes a call stream as a Perfetto trace: a track for the
// process, one per thread under it, a slice per call with its arguments,
// and its return value on the slice's end.
type PerfettoSink struct {
	w       *perfetto.Writer
	pid     int32
	proc    uint64
	threads map[int32]bool
	args    []perfetto.Arg
	// ThreadName names a thread's track (default "thread TID").
	ThreadName func(tid int32) string
}

// NewPerfettoSink starts a trace of process pid (named name) on w. clocks,
// if not nil, relate CLOCK_MONOTONIC to Perfetto's default trace clock.
func NewPerfettoSink(w io.Writer, pid int, name string, clocks *perfetto.Clocks) (*PerfettoSink, error) {
	s := &PerfettoSink{w: perfetto.NewWriter(w, clocks), pid: int32(pid), proc: processUUID(int32(pid)), threads: map[int32]bool{}, ThreadName: threadName}
	return s, s.w.Process(s.proc, s.pid, name)
}

// Track uuids: unique per trace, never 0.
func processUUID(pid int32) uint64 { return 1<<62 | uint64(uint32(pid)) }
func threadUUID(pid int32, tid int32) uint64 {
	return 1<<61 | uint64(uint32(pid))<<32 | uint64(uint32(tid))
}

// Event implements calltrace.Sink.
func (s *PerfettoSink) Event(e *calltrace.Event) error {
	if e.Kind == calltrace.Unloaded {
		// the process's: an instant on its own track, the object named
		s.args = append(s.args[:0], perfetto.Arg{Name: "object", Kind: perfetto.ArgString, Str: e.Func.Object})
		return s.w.Instant(e.TimeNs, s.proc, unloadedName, s.args)
	}
	track := threadUUID(s.pid, e.Thread)
	if !s.threads[e.Thread] {
		s.threads[e.Thread] = true
		if err := s.w.Thread(track, s.proc, s.pid, e.Thread, s.ThreadName(e.Thread)); err != nil {
			return err
		}
	}
	s.args = s.args[:0]
	switch e.Kind {
	case calltrace.Entry:
		for _, v := range e.Args {
			s.args = append(s.args, toArg(v))
		}
		return s.w.Begin(e.TimeNs, track, e.Func.Name, s.args)
	case calltrace.Exit:
		if e.Ret != nil {
			a := toArg(*e.Ret)
			a.Name = "return"
			s.args = append(s.args, a)
		}
		if e.Unwound {
			s.args = append(s.args, perfetto.Arg{Name: "unwound", Kind: perfetto.ArgBool, Uint: 1})
		}
		if e.Open {
			s.args = append(s.args, perfetto.Arg{Name: "still_running", Kind: perfetto.ArgBool, Uint: 1})
		}
		return s.w.End(e.TimeNs, track, s.args)
	case calltrace.Instant:
		for _, v := range e.Args {
			s.args = append(s.args, toArg(v))
		}
		return s.w.Instant(e.TimeNs, track, e.Func.Name, s.args)
	case calltrace.Lost:
		s.args = append(s.args, perfetto.Arg{Name: "events", Kind: perfetto.ArgUint, Uint: e.Count})
		return s.w.Instant(e.TimeNs, track, lostName, s.args)
	}
	return nil
}

// lostName names the instant that marks events a ring could not hold.
const lostName = "edgeprobe: events lost"

// unloadedName names the instant that marks an object the process unloaded
// during the capture (calltrace.Unloaded; its annotation "object" names it).
const unloadedName = "edgeprobe: object unloaded"

// Close implements calltrace.Sink.
func (s *PerfettoSink) Close() error { return s.w.Flush() }

// Bytes is how much the sink has written.
func (s *PerfettoSink) Bytes() uint64 { return s.w.Bytes }

// toArg maps a recorded value to a debug annotation: numbers, pointers,
// strings and structs keep their type; what has no typed counterpart (an
// enumerator, a char, a wide integer, a value not recorded) is its text.
func toArg(v calltrace.Value) perfetto.Arg {
	a := perfetto.Arg{Name: v.Name}
	switch v.Kind {
	case calltrace.Int, calltrace.Char:
		a.Kind, a.Int = perfetto.ArgInt, v.Int
	case calltrace.Uint:
		a.Kind, a.Uint = perfetto.ArgUint, v.Uint
	case calltrace.Bool:
		a.Kind, a.Uint = perfetto.ArgBool, v.Uint
	case calltrace.Float:
		a.Kind, a.Double = perfetto.ArgDouble, v.Float
	case calltrace.Pointer:
		a.Kind, a.Uint = perfetto.ArgPointer, v.Uint
	case calltrace.String:
		if v.Uint == 0 || v.Note != "" {
			a.Kind, a.Str = perfetto.ArgString, v.String()
		} else {
			a.Kind, a.Str = perfetto.ArgString, v.Str
			if v.Truncated {
				a.Str += "..."
			}
		}
	case calltrace.Struct:
		a.Kind = perfetto.ArgDict
		for _, f := range v.Fields {
			a.Dict = append(a.Dict, toArg(f))
		}
	default: // Enum, Wide, Missing
		a.Kind, a.Str = perfetto.ArgString, v.String()
	}
	return a
}

// fromArg is toArg's inverse as far as it goes (replay of a saved trace):
// a string that was a value not recorded comes back as one.
func fromArg(a perfetto.Arg) calltrace.Value {
	v := calltrace.Value{Name: a.Name}
	switch a.Kind {
	case perfetto.ArgInt:
		v.Kind, v.Int = calltrace.Int, a.Int
	case perfetto.ArgUint:
		v.Kind, v.Uint = calltrace.Uint, a.Uint
	case perfetto.ArgBool:
		v.Kind, v.Uint = calltrace.Bool, a.Uint
	case perfetto.ArgDouble:
		v.Kind, v.Float = calltrace.Float, a.Double
	case perfetto.ArgPointer:
		v.Kind, v.Uint = calltrace.Pointer, a.Uint
	case perfetto.ArgDict:
		v.Kind = calltrace.Struct
		for _, d := range a.Dict {
			v.Fields = append(v.Fields, fromArg(d))
		}
	default:
		switch {
		case strings.HasPrefix(a.Str, "?(") && strings.HasSuffix(a.Str, ")"):
			v.Kind, v.Note = calltrace.Missing, a.Str[2:len(a.Str)-1]
		case a.Str == "NULL": // a NULL char * (toArg writes its text)
			v.Kind = calltrace.String
		case len(a.Str) == dwarfargs.StringMax+3 && strings.HasSuffix(a.Str, "..."):
			// a string cut at the capture's bound (toArg appends "..."): a
			// string copied whole is shorter than the bound, so this one
			// cannot be a whole string ending in dots
			v.Kind, v.Uint, v.Str, v.Truncated = calltrace.String, 1, a.Str[:dwarfargs.StringMax], true
		default:
			v.Kind, v.Uint, v.Str = calltrace.String, 1, a.Str
			// an unreadable char *: "0x10 (unreadable)"
			if m := unreadableArg().FindStringSubmatch(a.Str); m != nil {
				if p, err := strconv.ParseUint(m[1], 16, 64); err == nil && p != 0 {
					v.Uint, v.Str, v.Note = p, "", m[2]
				}
			}
		}
	}
	return v
}

// unreadableArg is compiled on first use, not when hotpatch starts (D68).
var unreadableArg = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^0x([0-9a-f]+) \((unreadable)\)$`) })

// ReplayPerfetto reads a Perfetto trace (one this package wrote, or any of
// thread-track slices) and passes its calls to sink, in the file's order.
// Slices on tracks that are not threads are skipped; an "object unloaded"
// instant on the process's track is passed on as calltrace.Unloaded.
func ReplayPerfetto(r io.Reader, sink calltrace.Sink) error {
	pr := perfetto.NewReader(r)
	funcs := map[string]*calltrace.Function{}
	stacks := map[uint64][]*calltrace.Function{}
	fn := func(name string) *calltrace.Function {
		f := funcs[name]
		if f == nil {
			f = &calltrace.Function{Addr: uint64(len(funcs) + 1), Name: name}
			funcs[name] = f
		}
		return f
	}
	for {
		e, err := pr.Next()
		if err == io.EOF {
			return sink.Close()
		}
		if err != nil {
			return err
		}
		if e.Track != nil && e.Track.Tid == 0 && e.Type == perfetto.InstantEv && e.Name == unloadedName {
			// the process's own: an object it unloaded (PerfettoSink)
			f := &calltrace.Function{}
			for _, a := range e.Args {
				if a.Name == "object" {
					f.Object = a.Str
				}
			}
			if err := sink.Event(&calltrace.Event{Kind: calltrace.Unloaded, Thread: e.Track.Pid, TimeNs: e.TimeNs, Func: f}); err != nil {
				return err
			}
			continue
		}
		if e.Track == nil || e.Track.Tid == 0 {
			continue
		}
		ce := calltrace.Event{Thread: e.Track.Tid, TimeNs: e.TimeNs}
		switch e.Type {
		case perfetto.SliceBegin:
			ce.Kind, ce.Func = calltrace.Entry, fn(e.Name)
			for _, a := range e.Args {
				ce.Args = append(ce.Args, fromArg(a))
			}
			stacks[e.Track.UUID] = append(stacks[e.Track.UUID], ce.Func)
		case perfetto.SliceEnd:
			st := stacks[e.Track.UUID]
			if len(st) == 0 {
				return fmt.Errorf("thread %d: a slice ends at %d that never began", e.Track.Tid, e.TimeNs)
			}
			ce.Kind, ce.Func = calltrace.Exit, st[len(st)-1]
			stacks[e.Track.UUID] = st[:len(st)-1]
			for _, a := range e.Args {
				switch a.Name {
				case "return":
					v := fromArg(a)
					v.Name = ""
					ce.Ret = &v
				case "unwound":
					ce.Unwound = true
				case "still_running":
					ce.Open = true
				}
			}
		case perfetto.InstantEv:
			if e.Name == lostName {
				ce.Kind = calltrace.Lost
				for _, a := range e.Args {
					if a.Name == "events" {
						ce.Count = a.Uint
					}
				}
				break
			}
			ce.Kind, ce.Func = calltrace.Instant, fn(e.Name)
			for _, a := range e.Args {
				ce.Args = append(ce.Args, fromArg(a))
			}
		default:
			continue
		}
		if err := sink.Event(&ce); err != nil {
			return err
		}
	}
}
