package report

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/shm"
)

// FuncStats is one function's row. The JSON key names are an interface
// (scripts read them); keep them.
type FuncStats struct {
	Name      string `json:"name"`
	Object    string `json:"object"`
	Address   string `json:"address"`
	Entries   uint64 `json:"entries"`
	Exits     uint64 `json:"exits"`
	TotalNs   uint64 `json:"total_ns"`
	MeanNs    uint64 `json:"mean_ns"`
	MinNs     uint64 `json:"min_ns"`
	P50Ns     uint64 `json:"p50_ns"`
	P99Ns     uint64 `json:"p99_ns"`
	MaxNs     uint64 `json:"max_ns"`
	Orphans   uint64 `json:"orphan_exits"`      // exits with no matching entry (probe turned on mid-call)
	Unmatched uint64 `json:"unmatched_entries"` // entries never exited (longjmp, unwinding, probe turned off)
}

// Stats is a snapshot of a process's functions.
type Stats struct {
	PID       int         `json:"pid"`
	Exited    bool        `json:"exited"`
	Functions []FuncStats `json:"functions"`
	Dropped   Dropped     `json:"dropped"`
}

// Dropped counts what the runtime could not record.
type Dropped struct {
	TableFull    uint64 `json:"function_table_full"`
	ThreadsFull  uint64 `json:"thread_slots_full"`
	BeforeInit   uint64 `json:"outside_thread_life"` // before the runtime's constructor, or after a thread released its slot
	Reentrant    uint64 `json:"reentrant"`
	StackOverrun uint64 `json:"shadow_stack_overflow"`
	RingFull     uint64 `json:"trace_ring_full"`
}

// Collect snapshots a region. Percentiles come from the log2 histogram, so
// they are exact to within their bucket (a factor of two), clamped to the
// observed min and max.
func Collect(r *shm.Region, sym *Symbolizer) *Stats {
	h := r.Header()
	st := &Stats{PID: int(h.Pid), Exited: r.Exited(), Functions: Rows(r.Functions(), sym)}
	c := r.Counters()
	st.Dropped = Dropped{TableFull: c.FuncDropEnters + c.FuncDropExits, ThreadsFull: c.ThreadDropHits,
		BeforeInit: c.PreinitDrops + c.LateDrops, Reentrant: c.ReentrantDrops, StackOverrun: c.StackOverflows, RingFull: c.RingDropped}
	return st
}

// Rows names and summarises functions.
func Rows(funcs []shm.Func, sym *Symbolizer) []FuncStats {
	rows := make([]FuncStats, 0, len(funcs))
	for i := range funcs {
		f := &funcs[i]
		name, obj := sym.Name(f.Addr, !f.Bare)
		rows = append(rows, FuncStats{
			Name: name, Object: obj, Address: fmt.Sprintf("%#x", f.Addr),
			Entries: f.Entries, Exits: f.Exits, TotalNs: f.SumNs, MeanNs: f.MeanNs(), MinNs: f.MinNs,
			P50Ns: f.Percentile(0.50), P99Ns: f.Percentile(0.99), MaxNs: f.MaxNs,
			Orphans: f.Orphans, Unmatched: f.Unmatched,
		})
	}
	return rows
}

// SortKeys are the orders Sort accepts.
var SortKeys = []string{"calls", "total", "p99", "max", "name"}

// Sort orders the rows, largest first (name: alphabetical).
func (s *Stats) Sort(by string) error {
	less := map[string]func(a, b *FuncStats) bool{
		"calls": func(a, b *FuncStats) bool { return a.Entries > b.Entries },
		"total": func(a, b *FuncStats) bool { return a.TotalNs > b.TotalNs },
		"p99":   func(a, b *FuncStats) bool { return a.P99Ns > b.P99Ns },
		"max":   func(a, b *FuncStats) bool { return a.MaxNs > b.MaxNs },
		"name":  func(a, b *FuncStats) bool { return a.Name < b.Name },
	}[by]
	if less == nil {
		return fmt.Errorf("cannot sort by %q (calls, total, p99, max, name)", by)
	}
	sort.SliceStable(s.Functions, func(i, j int) bool {
		a, b := &s.Functions[i], &s.Functions[j]
		if less(a, b) != less(b, a) {
			return less(a, b)
		}
		return a.Name < b.Name
	})
	return nil
}

// Top keeps the first k rows (k <= 0 keeps all).
func (s *Stats) Top(k int) {
	if k > 0 && k < len(s.Functions) {
		s.Functions = s.Functions[:k]
	}
}

// WriteTable prints the rows for a person.
func (s *Stats) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "CALLS\tTOTAL\tMEAN\tP50\tP99\tMAX\t FUNCTION\t OBJECT\t")
	for _, f := range s.Functions {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t %s\t %s\t\n", f.Entries, dur(f.TotalNs), dur(f.MeanNs), dur(f.P50Ns), dur(f.P99Ns), dur(f.MaxNs), f.Name, base(f.Object))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	d := s.Dropped
	if d != (Dropped{}) {
		fmt.Fprintf(w, "dropped: table full %d, threads full %d, outside thread life %d, reentrant %d, stack overflow %d, trace ring full %d\n",
			d.TableFull, d.ThreadsFull, d.BeforeInit, d.Reentrant, d.StackOverrun, d.RingFull)
	}
	return nil
}

func dur(ns uint64) string {
	if ns == 0 {
		return "-"
	}
	return time.Duration(ns).Round(roundTo(ns)).String()
}

func roundTo(ns uint64) time.Duration {
	switch {
	case ns >= uint64(time.Second):
		return time.Millisecond
	case ns >= uint64(time.Millisecond):
		return time.Microsecond
	case ns >= 10*uint64(time.Microsecond):
		return 100 * time.Nanosecond
	}
	return 1
}

func base(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[i+1:]
		}
	}
	return p
}
