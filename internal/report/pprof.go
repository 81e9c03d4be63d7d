package report

import (
	"io"
	"time"

	"github.com/google/pprof/profile"
)

// Profile converts per-function stats into a pprof profile with two sample
// types, calls (count) and latency (nanoseconds, inclusive), one sample per
// function labelled with its p50, p99 and max: `go tool pprof -top` ranks
// functions by total latency, `-sample_index=calls` by calls.
func Profile(funcs []FuncStats, start time.Time, dur time.Duration) *profile.Profile {
	p := &profile.Profile{
		SampleType:        []*profile.ValueType{{Type: "calls", Unit: "count"}, {Type: "latency", Unit: "nanoseconds"}},
		DefaultSampleType: "latency",
		TimeNanos:         start.UnixNano(),
		DurationNanos:     dur.Nanoseconds(),
	}
	mappings := map[string]*profile.Mapping{}
	for i, f := range funcs {
		if f.Entries == 0 && f.TotalNs == 0 {
			continue
		}
		m := mappings[f.Object]
		if m == nil && f.Object != "" {
			m = &profile.Mapping{ID: uint64(len(mappings) + 1), File: f.Object, HasFunctions: true}
			mappings[f.Object] = m
			p.Mapping = append(p.Mapping, m)
		}
		fn := &profile.Function{ID: uint64(i + 1), Name: f.Name, SystemName: f.Name, Filename: f.Object}
		loc := &profile.Location{ID: uint64(i + 1), Mapping: m, Line: []profile.Line{{Function: fn}}}
		p.Function = append(p.Function, fn)
		p.Location = append(p.Location, loc)
		p.Sample = append(p.Sample, &profile.Sample{
			Location: []*profile.Location{loc},
			Value:    []int64{int64(f.Entries), int64(f.TotalNs)},
			NumLabel: map[string][]int64{"p50": {int64(f.P50Ns)}, "p99": {int64(f.P99Ns)}, "max": {int64(f.MaxNs)}},
			NumUnit:  map[string][]string{"p50": {"nanoseconds"}, "p99": {"nanoseconds"}, "max": {"nanoseconds"}},
		})
	}
	return p
}

// WriteProfile writes p in pprof's gzipped protobuf format after checking it.
func WriteProfile(w io.Writer, p *profile.Profile) error {
	if err := p.CheckValid(); err != nil {
		return err
	}
	return p.Write(w)
}
