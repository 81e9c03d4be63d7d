package report

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// referenceProfile is the profile WriteProfile wrote through
// github.com/google/pprof/profile before it encoded profile.proto itself:
// what it writes must read back as this.
func referenceProfile(funcs []FuncStats, start time.Time, dur time.Duration) *profile.Profile {
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

// TestWriteProfile: what WriteProfile writes parses with pprof's own
// reader, is valid, and holds what the reference profile holds: sample
// types, the default one, time and duration, one sample per function that
// ran (values and p50/p99/max labels), its location, function and mapping,
// functions of no object (no mapping) and functions that never ran (left out).
func TestWriteProfile(t *testing.T) {
	funcs := []FuncStats{
		{Name: "main", Object: "/bin/prog", Entries: 1, TotalNs: 5e9, P50Ns: 5e9, P99Ns: 5e9, MaxNs: 5e9},
		{Name: "idle", Object: "/bin/prog"},
		{Name: "handle_request", Object: "/bin/prog", Entries: 1 << 40, TotalNs: 1<<62 + 3, P50Ns: 120, P99Ns: 4500, MaxNs: 1 << 50},
		{Name: "lib_fn", Object: "/usr/lib/libx.so.1", Entries: 7, TotalNs: 0, P50Ns: 0, P99Ns: 1, MaxNs: 2},
		{Name: "anon\x1b[2J", Entries: 3, TotalNs: 300, P50Ns: 100, P99Ns: 100, MaxNs: 100},
		{Name: "main", Object: "/usr/lib/libx.so.1", Entries: 2, TotalNs: 10},
	}
	start := time.Unix(1795000000, 123456789)
	var buf bytes.Buffer
	if err := WriteProfile(&buf, funcs, start, 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	got, err := profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if err := got.CheckValid(); err != nil {
		t.Fatal(err)
	}
	// The reference as pprof writes it and reads it back.
	var ref bytes.Buffer
	if err := referenceProfile(funcs, start, 1500*time.Millisecond).Write(&ref); err != nil {
		t.Fatal(err)
	}
	want, err := profile.Parse(&ref)
	if err != nil {
		t.Fatal(err)
	}
	if g, w := got.String(), want.String(); g != w {
		t.Fatalf("the profile reads back as\n%s\nwant\n%s", g, w)
	}
	if len(got.Sample) != 5 || len(got.Mapping) != 2 || got.DefaultSampleType != "latency" {
		t.Fatalf("%d samples and %d mappings, default %q; want 5, 2 and latency", len(got.Sample), len(got.Mapping), got.DefaultSampleType)
	}

	// No function that ran: a valid, empty profile.
	buf.Reset()
	if err := WriteProfile(&buf, funcs[1:2], start, time.Second); err != nil {
		t.Fatal(err)
	}
	if got, err = profile.Parse(&buf); err != nil || got.CheckValid() != nil || len(got.Sample) != 0 {
		t.Fatalf("empty profile: %v, %d samples", err, len(got.Sample))
	}
}
