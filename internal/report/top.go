package report

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
	"github.com/edgeprobe/edgeprobe/internal/shm"
)

// TopRow is one function's activity over an interval. The JSON key names
// are an interface (scripts read them); keep them.
type TopRow struct {
	Name       string  `json:"name"`
	Object     string  `json:"object"`
	Address    string  `json:"address"`
	Calls      uint64  `json:"calls"` // entries during the interval
	PerSec     float64 `json:"calls_per_sec"`
	MeanNs     uint64  `json:"mean_ns"` // of the calls that returned during the interval
	P50Ns      uint64  `json:"p50_ns"`  // log2-bucket resolution, like stats
	P99Ns      uint64  `json:"p99_ns"`
	TotalCalls uint64  `json:"total_calls"` // since the runtime started counting
}

// TopSnapshot is what happened during one interval.
type TopSnapshot struct {
	PID        int       `json:"pid"`
	Time       time.Time `json:"time"`
	IntervalNs int64     `json:"interval_ns"`
	Functions  []TopRow  `json:"functions"` // those called during the interval, busiest first
	Exited     bool      `json:"exited"`
}

// TopSampler turns successive snapshots of a region's function table into
// per-interval rates and percentiles (from the histograms' differences).
type TopSampler struct {
	pid    int
	sym    *Symbolizer
	prev   map[uint64]shm.Func // by key (address, bare bit)
	prevAt time.Time
	names  map[uint64][2]string
}

// NewTopSampler starts a sampler for process pid.
func NewTopSampler(pid int, sym *Symbolizer) *TopSampler {
	return &TopSampler{pid: pid, sym: sym, names: map[uint64][2]string{}}
}

func funcKey(f *shm.Func) uint64 {
	if f.Bare {
		return f.Addr | shm.KeyBare
	}
	return f.Addr
}

// Sample takes the table as read at now; it returns nil the first time
// (there is no interval yet).
func (t *TopSampler) Sample(funcs []shm.Func, now time.Time) *TopSnapshot {
	cur := make(map[uint64]shm.Func, len(funcs))
	for _, f := range funcs {
		cur[funcKey(&f)] = f
	}
	prev, prevAt := t.prev, t.prevAt
	t.prev, t.prevAt = cur, now
	if prev == nil {
		return nil
	}
	snap := &TopSnapshot{PID: t.pid, Time: now, IntervalNs: now.Sub(prevAt).Nanoseconds(), Functions: []TopRow{}}
	secs := now.Sub(prevAt).Seconds()
	for key, f := range cur {
		p := prev[key]
		calls := sub(f.Entries, p.Entries)
		if calls == 0 {
			continue
		}
		var hist [shm.HistBuckets]uint64
		for b := range hist {
			hist[b] = sub(f.Hist[b], p.Hist[b])
		}
		row := TopRow{Calls: calls, PerSec: float64(calls) / secs, TotalCalls: f.Entries, Address: fmt.Sprintf("%#x", f.Addr),
			P50Ns: shm.Percentile(&hist, 0.50, 0, 0), P99Ns: shm.Percentile(&hist, 0.99, 0, 0)}
		if n := sub(f.Samples, p.Samples); n > 0 {
			row.MeanNs = sub(f.SumNs, p.SumNs) / n
		}
		nm, ok := t.names[key]
		if !ok {
			name, obj := t.sym.Name(f.Addr, !f.Bare)
			nm = [2]string{name, obj}
			t.names[key] = nm
		}
		row.Name, row.Object = nm[0], nm[1]
		snap.Functions = append(snap.Functions, row)
	}
	sort.Slice(snap.Functions, func(i, j int) bool {
		a, b := &snap.Functions[i], &snap.Functions[j]
		if a.Calls != b.Calls {
			return a.Calls > b.Calls
		}
		return a.Name < b.Name
	})
	return snap
}

// Check is the error for a function whose counts went down since the last
// Sample (shm.ErrOverflow, D92), naming it; nil when none did. The runtime's
// counters only grow (thread slots are reused with their counts, nothing is
// ever reset), so a count that went down was written by the program itself
// or corrupted, and its interval's calls, rate and latencies are not the
// process's. Call it before Sample.
func (t *TopSampler) Check(funcs []shm.Func) error {
	for i := range funcs {
		f := &funcs[i]
		p, ok := t.prev[funcKey(f)]
		if !ok {
			continue
		}
		var what []string
		for _, c := range []struct {
			name      string
			cur, prev uint64
		}{{"entries", f.Entries, p.Entries}, {"exits", f.Exits, p.Exits}, {"samples", f.Samples, p.Samples}, {"total_ns", f.SumNs, p.SumNs}} {
			if c.cur < c.prev {
				what = append(what, c.name+" went down")
			}
		}
		if len(what) > 0 {
			name, obj := t.sym.Name(f.Addr, !f.Bare)
			return fmt.Errorf("%w: %w: function %s (%#x in %s): %s (the program wrote its own counters, or they are corrupt)",
				shm.ErrUntrusted, shm.ErrOverflow, calltrace.Printable(name), f.Addr, calltrace.Printable(obj), strings.Join(what, ", "))
		}
	}
	return nil
}

// sub is a counter's growth, 0 for one that went down (Check refuses those
// first; a histogram bucket alone is not checked there).
func sub(cur, prev uint64) uint64 {
	if cur < prev {
		return 0
	}
	return cur - prev
}

// WriteTable prints the snapshot's first rows (rows <= 0: all) for a person.
func (s *TopSnapshot) WriteTable(w io.Writer, rows int) error {
	state := ""
	if s.Exited {
		state = ", process exited"
	}
	fmt.Fprintf(w, "edgeprobe top: pid %d, %s, every %s: %d functions called%s\n", s.PID, s.Time.Format("15:04:05"),
		time.Duration(s.IntervalNs).Round(time.Millisecond), len(s.Functions), state)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "CALLS/S\tMEAN\tP50\tP99\tCALLS\t FUNCTION\t OBJECT\t")
	for i, f := range s.Functions {
		if rows > 0 && i == rows {
			break
		}
		fmt.Fprintf(tw, "%.0f\t%s\t%s\t%s\t%d\t %s\t %s\t\n", f.PerSec, dur(f.MeanNs), dur(f.P50Ns), dur(f.P99Ns), f.TotalCalls, calltrace.Printable(f.Name), calltrace.Printable(base(f.Object)))
	}
	return tw.Flush()
}
