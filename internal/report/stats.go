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
	// Entries deeper than the shadow stack (counted, untimed) and their exits.
	DeepEntries uint64 `json:"untimed_deep_entries"`
	DeepExits   uint64 `json:"untimed_deep_exits"`
	Open        uint64 `json:"open_frames"` // calls in progress (or not yet found dead) when read
	// Balanced: entries - untimed_deep_entries == exits - orphan_exits -
	// untimed_deep_exits + unmatched_entries + open_frames (every tracked
	// entry accounted for; exact once the process is quiet).
	Balanced bool `json:"balanced"`
}

// Stats is a snapshot of a process's functions.
type Stats struct {
	PID       int         `json:"pid"`
	Exited    bool        `json:"exited"`
	Functions []FuncStats `json:"functions"`
	Dropped   Dropped     `json:"dropped"`
	// LeftOn names the capture-only runtime settings found on while no
	// capture held the process (see MarkLeftOn): a capture killed before
	// its close left them, and they change what the runtime records.
	LeftOn []string `json:"left_on_by_killed_capture,omitempty"`
	// QuotaRunning is K while a running capture (profile, trace --rate)
	// holds every probed function of the process to K recorded calls per
	// quota epoch (D57: the quota is process-wide): the counts read now are
	// not the process's calls. 0: no quota on.
	QuotaRunning uint32 `json:"quota_held_by_running_capture,omitempty"`
}

// QuotaRunningLine is the warning for QuotaRunning, "" when it is 0.
func (s *Stats) QuotaRunningLine() string {
	if s.QuotaRunning == 0 {
		return ""
	}
	return fmt.Sprintf("warning: a running capture (profile or trace --rate) holds every probed function to %d recorded calls per quota epoch: these counts are not the process's calls until it ends", s.QuotaRunning)
}

// leftOnBits describes each capture-only control bit and its effect.
var leftOnBits = []struct {
	bit  uint32
	what string
}{
	{shm.CtlQuota, "quota (each function records at most a few calls per epoch: counts stop growing)"},
	{shm.CtlFilter, "trace filter (depth, threads or minimum duration)"},
	{shm.CtlTrace, "trace events (every hook takes the slow path)"},
	{shm.CtlArgs, "argument records"},
}

// MarkLeftOn records which capture-only bits of ctl are on; call it only
// when no capture holds the process (no tracer), for then nothing should
// have them on.
func (s *Stats) MarkLeftOn(ctl uint32) {
	s.LeftOn = nil
	for _, b := range leftOnBits {
		if ctl&b.bit != 0 {
			s.LeftOn = append(s.LeftOn, b.what)
		}
	}
}

// LeftOnLine is the warning for LeftOn, "" when nothing is left on.
func (s *Stats) LeftOnLine() string {
	if len(s.LeftOn) == 0 {
		return ""
	}
	return "warning: left on by a capture killed before it finished: " + strings.Join(s.LeftOn, "; ") +
		"; the next capture (trace, profile, or top --enable) turns them off"
}

// Dropped counts what the runtime could not record, or recorded only in
// part, by reason (docs/runtime.md lists them).
type Dropped struct {
	TableFull    uint64 `json:"function_table_full"`   // hooks of functions the table, at its cap, had no slot for
	ThreadsFull  uint64 `json:"thread_slots_full"`     // hooks of threads that found no slot
	BeforeInit   uint64 `json:"outside_thread_life"`   // before the runtime's constructor, or after a thread released its slot
	Reentrant    uint64 `json:"reentrant"`             // hooks run inside a hook (signal handlers), and during fork
	StackOverrun uint64 `json:"shadow_stack_overflow"` // entries deeper than the shadow stack: counted, untimed
	RingFull     uint64 `json:"trace_ring_full"`       // trace events
	// Counted, not lost, but not matched: see the per-function columns.
	Unmatched uint64 `json:"unmatched_entries"` // frames found dead without their exit
	Orphans   uint64 `json:"orphan_exits"`      // exits with no frame
	// Frames deeper than the shadow stack found dead (their functions are
	// unknown: no frame was stored).
	DeepLost uint64 `json:"deep_frames_lost"`
	// Hooks a signal handler longjmp'd out of: that one call's record may be
	// incomplete.
	Abandoned      uint64 `json:"abandoned_hooks"`
	FentryUnwound  uint64 `json:"fentry_unwound"`   // hijacked frames an exception or pthread_exit unwound (counted unmatched)
	FentryBadSites uint64 `json:"fentry_bad_sites"` // __fentry__ call sites not recognised: entries only
	FentryRestored uint64 `json:"fentry_restored"`  // dead hijacked frames whose return slot was given back
}

// Collect snapshots a region. Percentiles come from the log2 histogram, so
// they are exact to within their bucket (a factor of two), clamped to the
// observed min and max.
//
// Counts that wrap (a sum past 2^64, D92) are an error naming the function
// or the counter, never a number.
func Collect(r *shm.Region, sym *Symbolizer) (*Stats, error) {
	h := r.Header()
	funcs := r.Functions()
	if err := CheckSums(funcs, sym); err != nil {
		return nil, err
	}
	c := r.Counters()
	tableFull, ok1 := sum(c.FuncDropEnters, c.FuncDropExits)
	beforeInit, ok2 := sum(c.PreinitDrops, c.LateDrops)
	if !ok1 {
		c.Overflow = append(c.Overflow, "function_table_full")
	}
	if !ok2 {
		c.Overflow = append(c.Overflow, "outside_thread_life")
	}
	if err := CheckCounters(&c); err != nil {
		return nil, err
	}
	st := &Stats{PID: int(h.Pid), Exited: r.Exited(), Functions: Rows(funcs, sym)}
	st.Dropped = Dropped{TableFull: tableFull, ThreadsFull: c.ThreadDropHits,
		BeforeInit: beforeInit, Reentrant: c.ReentrantDrops, StackOverrun: c.StackOverflows, RingFull: c.RingDropped,
		Unmatched: c.Unmatched, Orphans: c.Orphans, DeepLost: c.DeepLost, Abandoned: c.AbandonedHooks,
		FentryUnwound: c.FentryUnwound, FentryBadSites: c.FentryBadSites, FentryRestored: c.FentryRestored}
	return st, nil
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
			Orphans: f.Orphans, Unmatched: f.Unmatched, DeepEntries: f.DeepEntries, DeepExits: f.DeepExits,
			Open: f.Open, Balanced: f.Balanced(),
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
	// LOST: the call's latency is missing (unmatched entries, orphan exits,
	// entries too deep to time); OPEN: frames still on a stack.
	fmt.Fprintln(tw, "CALLS\tTOTAL\tMEAN\tP50\tP99\tMAX\tLOST\tOPEN\t FUNCTION\t OBJECT\t")
	for _, f := range s.Functions {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t %s\t %s\t\n", f.Entries, dur(f.TotalNs), dur(f.MeanNs), dur(f.P50Ns), dur(f.P99Ns), dur(f.MaxNs),
			count(f.Unmatched+f.Orphans+f.DeepEntries), count(f.Open), calltrace.Printable(f.Name), calltrace.Printable(base(f.Object)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if line := s.Dropped.line(); line != "" {
		fmt.Fprintln(w, line)
	}
	if line := s.LeftOnLine(); line != "" {
		fmt.Fprintln(w, line)
	}
	if line := s.QuotaRunningLine(); line != "" {
		fmt.Fprintln(w, line)
	}
	return nil
}

// line lists the non-zero loss counters with their reasons, "" when all are
// zero.
func (d Dropped) line() string {
	var parts []string
	for _, c := range []struct {
		n    uint64
		what string
	}{
		{d.Unmatched, "unmatched entries (frame found dead: longjmp, exception, exit probe off)"},
		{d.Orphans, "orphan exits (no frame: probe turned on mid-call, fork child)"},
		{d.StackOverrun, "untimed entries deeper than the shadow stack"},
		{d.DeepLost, "frames deeper than the shadow stack found dead"},
		{d.Abandoned, "hooks abandoned by a signal handler's longjmp"},
		{d.Reentrant, "hooks dropped inside a hook (signal handler) or fork"},
		{d.TableFull, "hooks dropped: function table at its cap (EDGEPROBE_MAX_FUNCS)"},
		{d.ThreadsFull, "hooks dropped: thread slots full"},
		{d.BeforeInit, "hooks dropped outside a thread's life"},
		{d.RingFull, "trace events dropped: ring full"},
		{d.FentryUnwound, "fentry frames unwound by an exception or pthread_exit"},
		{d.FentryBadSites, "fentry sites not recognised (entries only)"},
		{d.FentryRestored, "dead fentry frames given their return address back"},
	} {
		if c.n != 0 {
			parts = append(parts, fmt.Sprintf("%d %s", c.n, c.what))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "lost or unmatched: " + strings.Join(parts, "; ")
}

func count(n uint64) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprint(n)
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
