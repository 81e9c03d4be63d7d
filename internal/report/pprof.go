package report

import (
	"compress/gzip"
	"io"
	"sort"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// WriteProfile writes per-function stats as a pprof profile (gzipped
// protobuf, profile.proto) with two sample types, calls (count) and latency
// (nanoseconds, inclusive), one sample per function labelled with its p50,
// p99 and max: `go tool pprof -top` ranks functions by total latency,
// `-sample_index=calls` by calls.
//
// It encodes profile.proto itself rather than through
// github.com/google/pprof/profile: that package compiles a dozen regular
// expressions when it is initialised, which every start of hotpatch paid
// (about a tenth of a toggle's CPU time), profile or not (D68). The tests
// read what it writes with that package (TestWriteProfile).
func WriteProfile(w io.Writer, funcs []FuncStats, start time.Time, dur time.Duration) error {
	var e pprofEncoder
	e.strings = map[string]int64{"": 0}
	e.table = []string{""}
	var out []byte
	for _, vt := range [][2]string{{"calls", "count"}, {"latency", "nanoseconds"}} {
		out = e.message(out, 1, func(b []byte) []byte {
			b = e.int(b, 1, e.str(vt[0]))
			return e.int(b, 2, e.str(vt[1]))
		})
	}
	mappings := map[string]uint64{}
	var mapOrder []string
	var samples, locations, functions []byte
	for i, f := range funcs {
		if f.Entries == 0 && f.TotalNs == 0 {
			continue
		}
		id := uint64(i + 1)
		m := mappings[f.Object]
		if m == 0 && f.Object != "" {
			m = uint64(len(mappings) + 1)
			mappings[f.Object] = m
			mapOrder = append(mapOrder, f.Object)
		}
		functions = e.message(functions, 5, func(b []byte) []byte {
			b = e.uint(b, 1, id)
			name := e.str(f.Name)
			b = e.int(b, 2, name)
			b = e.int(b, 3, name)
			return e.int(b, 4, e.str(f.Object))
		})
		locations = e.message(locations, 4, func(b []byte) []byte {
			b = e.uint(b, 1, id)
			b = e.uint(b, 2, m)
			return e.message(b, 4, func(b []byte) []byte { return e.uint(b, 1, id) })
		})
		samples = e.message(samples, 2, func(b []byte) []byte {
			b = e.packed(b, 1, id)
			b = e.packed(b, 2, uint64(int64(f.Entries)), uint64(int64(f.TotalNs)))
			labels := []struct {
				key string
				v   int64
			}{{"max", int64(f.MaxNs)}, {"p50", int64(f.P50Ns)}, {"p99", int64(f.P99Ns)}}
			sort.Slice(labels, func(a, b int) bool { return labels[a].key < labels[b].key })
			for _, l := range labels {
				b = e.message(b, 3, func(b []byte) []byte {
					b = e.int(b, 1, e.str(l.key))
					b = e.int(b, 3, l.v)
					return e.int(b, 4, e.str("nanoseconds"))
				})
			}
			return b
		})
	}
	out = append(out, samples...)
	for _, obj := range mapOrder {
		out = e.message(out, 3, func(b []byte) []byte {
			b = e.uint(b, 1, mappings[obj])
			b = e.int(b, 5, e.str(obj))
			return e.uint(b, 7, 1) // has_functions
		})
	}
	out = append(out, locations...)
	out = append(out, functions...)
	def := e.str("latency")
	for _, s := range e.table {
		out = protowire.AppendTag(out, 6, protowire.BytesType)
		out = protowire.AppendString(out, s)
	}
	out = e.int(out, 9, start.UnixNano())
	out = e.int(out, 10, dur.Nanoseconds())
	out = e.int(out, 14, def)
	zw := gzip.NewWriter(w)
	if _, err := zw.Write(out); err != nil {
		return err
	}
	return zw.Close()
}

// pprofEncoder holds a profile's string table while it is encoded.
type pprofEncoder struct {
	strings map[string]int64
	table   []string
}

// str returns s's index in the string table, adding it.
func (e *pprofEncoder) str(s string) int64 {
	if i, ok := e.strings[s]; ok {
		return i
	}
	i := int64(len(e.table))
	e.strings[s] = i
	e.table = append(e.table, s)
	return i
}

// int and uint append a varint field; zero is the default and is left out,
// as proto3 does.
func (e *pprofEncoder) int(b []byte, num protowire.Number, v int64) []byte {
	return e.uint(b, num, uint64(v))
}

func (e *pprofEncoder) uint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// packed appends a packed repeated varint field.
func (e *pprofEncoder) packed(b []byte, num protowire.Number, vs ...uint64) []byte {
	var p []byte
	for _, v := range vs {
		p = protowire.AppendVarint(p, v)
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, p)
}

// message appends an embedded message that body encodes.
func (e *pprofEncoder) message(b []byte, num protowire.Number, body func([]byte) []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, body(nil))
}
