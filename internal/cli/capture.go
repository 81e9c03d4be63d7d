package cli

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
	"github.com/edgeprobe/edgeprobe/internal/capture"
	"github.com/edgeprobe/edgeprobe/internal/hotpatch"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/report"
	"github.com/edgeprobe/edgeprobe/internal/shm"
)

// selection is the --enable/--kind/--provider set of the capture commands.
type selection struct {
	patterns       []string
	kind, provider string
}

func (s *selection) register(cmd *cobra.Command, help string) {
	stringsVarP(cmd.Flags(), &s.patterns, "enable", "e", help)
	cmd.Flags().StringVar(&s.kind, "kind", "both", "which probes of a function: entry, exit or both")
	cmd.Flags().StringVar(&s.provider, "provider", probelist.ProviderAll, "which providers' probes: cyg, fentry or all")
}

func (s *selection) parse() ([]probelist.Selector, error) {
	prov, err := probelist.ParseProvider(s.provider)
	if err != nil {
		return nil, usageError{err}
	}
	var out []probelist.Selector
	for _, p := range s.patterns {
		sel, err := probelist.ParseSelector(p, s.kind)
		if err != nil {
			return nil, usageError{err}
		}
		sel.Provider = prov
		out = append(out, sel)
	}
	return out, nil
}

// progressTo returns a progress printer for w when w is a terminal, else nil:
// long operations show progress to a person and stay quiet in a pipe.
func progressTo(w io.Writer, what string) func(time.Duration, string) {
	f, ok := w.(*os.File)
	if !ok {
		return nil
	}
	if _, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS); err != nil {
		return nil
	}
	return func(elapsed time.Duration, detail string) {
		fmt.Fprintf(w, "\r%s: %s, %s   ", what, elapsed.Truncate(100*time.Millisecond), detail)
	}
}

func endProgress(w io.Writer, p func(time.Duration, string)) {
	if p != nil {
		fmt.Fprintln(w)
	}
}

// signalContext is cancelled by any signal that would otherwise end the
// process with probes or traps half-set: SIGINT, SIGTERM, and SIGHUP (the
// terminal went away), SIGQUIT (which would dump core) and SIGPIPE (stdout
// closed by a pager). Each ends the batch the way ctx cancellation does:
// rolled back or completed, never left with an int3 in the text.
//
// Its stop ends the context but leaves the signals caught (a later one is
// dropped): hotpatch exits once its command returns, and taking each
// signal back is a round trip to the Go runtime's signal-mask thread (two
// locked threads: a few context switches each way), five of them at the
// end of every toggle (D71).
func signalContext() (context.Context, context.CancelFunc) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGPIPE)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func newStatsCmd(stdout, stderr io.Writer, inj *injectFlags) *cobra.Command {
	var (
		tf    targetFlags
		input string
		sort  string
		top   int
	)
	cmd := &cobra.Command{
		Use:   "stats (--pid N | --input FILE) [--json] [--sort calls|total|p99|max|name] [--top K]",
		Short: "Show per-function calls and latency recorded by the edgeprobe runtime",
		Long: `stats reads the shared-memory region of a process running under the runtime
(LD_PRELOAD=libedgeprobe.so), live, or a file it wrote at exit (EDGEPROBE_OUTPUT=FILE), and
prints one row per function: calls, total, mean, p50, p99 and max inclusive latency.
Percentiles come from a log2 histogram: exact to within a factor of two.
Functions are named from the objects' symbols (static functions and shared libraries
included), then from --probes lists, else sub_<address>.`,
		Example: `  hotpatch stats --pid 4242 --top 10
  hotpatch stats --pid 4242 --sort p99 --json | jq '.functions[0]'
  EDGEPROBE_OUTPUT=run.ep LD_PRELOAD=bin/libedgeprobe.so ./app && hotpatch stats --input run.ep`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			if (tf.pid > 0) == (input != "") {
				return usagef("give exactly one of --pid and --input")
			}
			if input != "" {
				defer guardMapped(input, &err)()
			}
			var lists []*probelist.List
			for _, f := range tf.probes {
				l, err := probelist.ReadFile(f)
				if err != nil {
					return err
				}
				lists = append(lists, l)
			}
			var (
				region *shm.Region
				sym    *report.Symbolizer
			)
			if input != "" {
				if region, err = shm.Open(input); err != nil {
					return err
				}
				if sym, err = report.ForMaps(region.Maps(), lists); err != nil {
					region.Close()
					return fmt.Errorf("%s: resolving names: %w", input, err)
				}
			} else {
				if _, err := ensureRuntime(cmd.Context(), tf.pid, inj, false, stderr, nil, nil); err != nil {
					return classify(err)
				}
				// Through a live thread when the main thread has exited
				// (D95): its /proc entry reaches no descriptor or map.
				via := procfs.Via(tf.pid)
				if region, err = shm.OpenPID(via); err != nil {
					return fmt.Errorf("pid %d: %w (is it running under LD_PRELOAD=libedgeprobe.so?)", tf.pid, err)
				}
				if sym, err = report.ForPID(via, lists); err != nil {
					region.Close()
					return err
				}
			}
			defer region.Close()
			st, err := report.Collect(region, sym)
			if err != nil {
				if input == "" {
					return fmt.Errorf("pid %d: %w", tf.pid, err)
				}
				return fmt.Errorf("%s: %w", input, err)
			}
			// A tracer is a capture (or another hotpatch) at work, whose
			// bits these are; with none, they were left by a killed one.
			if input == "" && !hotpatch.Held(tf.pid) {
				st.MarkLeftOn(region.Control())
			} else if input == "" && region.Control()&shm.CtlQuota != 0 {
				st.QuotaRunning = region.Header().QuotaK
			}
			if err := st.Sort(sort); err != nil {
				return usageError{err}
			}
			st.Top(top)
			if tf.json {
				return writeJSON(stdout, st)
			}
			return st.WriteTable(stdout)
		},
	}
	tf.register(cmd)
	cmd.Flags().StringVar(&input, "input", "", "read the file a process wrote at exit (EDGEPROBE_OUTPUT) instead of a live one")
	cmd.Flags().StringVar(&sort, "sort", "total", "order: calls, total, p99, max or name")
	cmd.Flags().IntVar(&top, "top", 0, "show only the first K functions")
	_ = cmd.RegisterFlagCompletionFunc("sort", cobra.FixedCompletions(report.SortKeys, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func newTraceCmd(stdout, stderr io.Writer, inj *injectFlags) *cobra.Command {
	var (
		tf       targetFlags
		sel      selection
		duration time.Duration
		output   string
		format   string
		maxCalls int
		maxDepth int
		tids     []int
		rate     uint64
		minDur   time.Duration
		argPats  []string
		retPats  []string
		ringEv   uint32
	)
	cmd := &cobra.Command{
		Use:   "trace --pid N --enable SEL --duration D -o FILE [--format perfetto|chrome-json|text] [--args GLOB] [--retval GLOB]",
		Short: "Record every call of the selected functions for a while, as a trace",
		Long: `trace turns on the selected probes, switches the runtime's per-thread event rings on,
collects them for the duration (or until the process ends), then switches them off and puts
every probe back as it was. Events the rings could not hold are counted and reported, never
silently lost.

Formats (--format; by default chosen from the output's extension: .json is chrome-json,
.txt is text, anything else perfetto):
  perfetto     Perfetto's native protobuf trace, written as a stream while capturing: open
               it in ui.perfetto.dev or trace_processor. One track per thread, one slice
               per call, nested as the calls were; interned names.
  chrome-json  Chrome trace-event JSON (legacy; held in memory until the end).
  text         the per-thread call graph with durations, like uftrace replay; to stdout
               without -o. 'hotpatch replay FILE' prints a saved Perfetto trace this way.

Arguments and return values (--args GLOB, --retval GLOB; fentry probes, -pg -mfentry):
the fentry functions GLOB names (among those --enable turns on; without --enable, those
whose probes are on) have their argument registers copied at entry and their return registers at the return, named and typed from the program's DWARF
(build with -g): handle_request(req=0x7f3a.., len=512) = 0. A char * is copied as a
string of up to 64 bytes at entry, never faulting the process (an unreadable pointer is
shown as such). What cannot be recorded says why: stack arguments past 64 bytes, the
unnamed arguments of a variadic function, long double return values, structs returned
in memory. cyg probes (-finstrument-functions) record which function ran and when, not
its arguments: their hooks run after the prologue, where the arguments are wherever the
compiler put them. At most 128 functions per capture. docs/tracing.md has the details.

Filters, enforced inside the target's runtime while the trace runs and removed after it:
--max-depth N records only calls fewer than N probed calls deep on their thread,
--tid T (repeatable, up to 8) only the threads named, --rate N at most N calls per function
per second (the calls over it are neither traced nor counted while the trace runs),
--min-duration D only calls that lasted at least D (with the callers they ran in).`,
		Example: `  hotpatch trace --pid 4242 --enable 'handle_*' --duration 2s -o trace.pftrace
  hotpatch trace --pid 4242 --enable parse --duration 200ms --format text | less
  hotpatch trace --pid 4242 --enable 'handle_*' --duration 2s -o trace.json   # chrome-json
  hotpatch trace --pid 4242 --enable 'handle_*' --args 'handle_*' --retval 'handle_*' --duration 1s --format text`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := tf.check(); err != nil {
				return err
			}
			if format == "" {
				format = formatFor(output)
			}
			switch format {
			case formatPerfetto, formatChrome:
				if output == "" || output == "-" {
					return usagef("--format %s needs -o FILE", format)
				}
			case formatText:
			default:
				return usagef("--format must be perfetto, chrome-json or text, not %q", format)
			}
			if duration <= 0 {
				return usagef("trace needs a positive --duration")
			}
			if minDur < 0 || minDur > time.Duration(math.MaxUint32) {
				return usagef("--min-duration must be 0 (any) .. %s", time.Duration(math.MaxUint32))
			}
			if len(argPats) > 0 && minDur > 0 {
				return usagef("--args cannot be combined with --min-duration: a held-back call's enter is written at its exit, without the arguments copied at its entry")
			}
			if maxDepth < 0 {
				return usagef("--max-depth must be 0 (any) or more")
			}
			if maxCalls < 0 {
				// A negative count read as "no limit" would hold chrome-json's
				// whole capture in memory, which its default limit prevents.
				return usagef("--max-calls must be 0 (no limit) or more")
			}
			if rate > math.MaxUint32 {
				return usagef("--rate must be 0 (no limit) .. %d calls a second", uint32(math.MaxUint32))
			}
			if len(tids) > shm.FilterTids {
				return usagef("--tid names %d threads; the runtime filters on at most %d", len(tids), shm.FilterTids)
			}
			for _, t := range tids {
				if t <= 0 {
					return usagef("--tid %d is not a thread id", t)
				}
			}
			if ringEv&(ringEv-1) != 0 {
				return usagef("--ring-events %d is not a power of two", ringEv)
			}
			if !cmd.Flags().Changed("max-calls") && format != formatChrome {
				maxCalls = 0 // the streaming formats hold nothing in memory
			}
			sels, err := sel.parse()
			if err != nil {
				return err
			}
			var out io.Writer = stdout
			var file *atomicOutput
			if output != "" && output != "-" {
				if file, err = createAtomic(output); err != nil {
					return err
				}
				defer file.abort() // no-op after commit
				out = file
			}
			var sink calltrace.Sink
			var tracer *report.Tracer
			switch format {
			case formatPerfetto:
				ps, err := report.NewPerfettoSink(out, tf.pid, processName(tf.pid), clockReading())
				if err != nil {
					return err
				}
				ps.ThreadName = func(tid int32) string { return threadComm(tf.pid, tid) }
				sink = ps
			case formatChrome:
				tracer = report.NewTracer(tf.pid)
				sink = tracer
			case formatText:
				sink = report.NewTextSink(out)
			}
			ctx, stop := signalContext()
			defer stop()
			if _, err := ensureRuntime(ctx, tf.pid, inj, false, stderr, tf.probes, sels); err != nil {
				return classify(err)
			}
			progress := progressTo(stderr, "tracing")
			if format == formatText && file == nil {
				progress = nil // the call graph itself goes to the terminal
			}
			res, err := capture.Trace(ctx, capture.Options{PID: tf.pid, ProbeFiles: tf.probes, Selectors: sels, Duration: duration, MaxCalls: maxCalls, Progress: progress,
				Args: argPats, Retval: retPats, RingEvents: ringEv, MaxDepth: maxDepth, Tids: tids, Rate: rate, MinDuration: minDur}, sink)
			endProgress(stderr, progress)
			if err != nil {
				return classify(err)
			}
			for _, n := range res.Notes {
				fmt.Fprintf(stderr, "hotpatch: trace: %s\n", calltrace.Printable(n))
			}
			if tracer != nil {
				if err := tracer.Write(out); err != nil {
					return err
				}
			}
			name := "stdout"
			if file != nil {
				if err := file.commit(); err != nil {
					return err
				}
				name = output
			}
			summary := map[string]any{"output": name, "format": format, "calls": res.Calls, "events": res.Events,
				"dropped_events": res.Dropped, "unpaired_exits": res.Unpaired, "unwound_calls": res.Unwound, "open_calls": res.Open,
				"duration_ns": res.Duration.Nanoseconds(), "stopped_at_max_calls": res.Limited, "arg_functions": res.ArgFuncs,
				"ring_events": res.RingEvents, "ring_capacity": res.RingCapacity, "threads": res.Threads, "rate_epochs": res.RateEpochs, "rate_in_flight": res.RateInFlight, "quota_held": res.QuotaHeld,
				"stale_events": res.Stale, "unloaded_objects": res.Unloaded,
				"quiet_tids": res.QuietTids}
			if n := res.SuggestRing(); n != 0 {
				summary["suggested_ring_events"] = n
			}
			summaryOut := stdout
			if file == nil {
				summaryOut = stderr // stdout holds the call graph
			}
			if tf.json {
				return writeJSON(summaryOut, summary)
			}
			fmt.Fprintf(summaryOut, "%s: %d calls (%d events, %d dropped by full rings, %d exits of calls begun before the capture) in %s\n",
				name, res.Calls, res.Events, res.Dropped, res.Unpaired, res.Duration.Round(time.Millisecond))
			if res.Limited {
				fmt.Fprintf(summaryOut, "stopped early at --max-calls %d\n", maxCalls)
			}
			if res.Dropped > 0 {
				fmt.Fprintln(summaryOut, dropMessage(res))
			}
			return nil
		},
	}
	tf.register(cmd)
	sel.register(cmd, "turn on the probes `SEL` selects for the capture (repeatable; default: what is on)")
	cmd.Flags().DurationVar(&duration, "duration", 0, "how long to record")
	cmd.Flags().StringVarP(&output, "output", "o", "", "write the trace to `FILE` (text: stdout without it)")
	cmd.Flags().StringVar(&format, "format", "", "perfetto, chrome-json or text (default: from the output's extension)")
	stringsVarP(cmd.Flags(), &argPats, "args", "", "record the arguments of the fentry functions `GLOB` names (repeatable; not with --min-duration)")
	stringsVarP(cmd.Flags(), &retPats, "retval", "", "record the return values of the fentry functions `GLOB` names (repeatable)")
	cmd.Flags().Uint32Var(&ringEv, "ring-events", 0, "size every thread's event ring to `N` events for the capture (a power of two; default: the process's, EDGEPROBE_RING_EVENTS); bigger rings drop less")
	cmd.Flags().IntVar(&maxCalls, "max-calls", 1000000, "stop early once this many calls are captured (0: no limit; default no limit but for chrome-json, which is held in memory)")
	cmd.Flags().IntVar(&maxDepth, "max-depth", 0, "record only calls fewer than `N` probed calls deep on their thread (0: any)")
	cmd.Flags().IntSliceVar(&tids, "tid", nil, "record only thread `T` (repeatable, up to 8)")
	cmd.Flags().Uint64Var(&rate, "rate", 0, "record at most `N` calls per function per second (0: no limit)")
	cmd.Flags().DurationVar(&minDur, "min-duration", 0, "record only calls that lasted at least `D` (0: any; at most 4.29s)")
	_ = cmd.RegisterFlagCompletionFunc("format", cobra.FixedCompletions([]string{formatPerfetto, formatChrome, formatText}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// Trace formats.
const (
	formatPerfetto = "perfetto"
	formatChrome   = "chrome-json"
	formatText     = "text"
)

// formatFor picks a trace format from an output file's name.
func formatFor(output string) string {
	switch {
	case output == "" || output == "-" || strings.HasSuffix(output, ".txt"):
		return formatText
	case strings.HasSuffix(output, ".json"):
		return formatChrome
	}
	return formatPerfetto
}

func newReplayCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "replay FILE",
		Short: "Print a saved Perfetto trace as a per-thread call graph",
		Long: `replay reads a trace written by 'hotpatch trace --format perfetto' (or any Perfetto trace
of thread-track slices) and prints each thread's calls as a call graph with durations,
arguments and return values, like uftrace replay: a call that made no traced call on one
line, the others opened with '{' and closed with '}'. FILE is a regular file, or a FIFO or
pipe of yours.`,
		Example: `  hotpatch trace --pid 4242 --enable 'handle_*' --duration 2s -o trace.pftrace
  hotpatch replay trace.pftrace | less`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// A regular file, or a FIFO of ours (D100): not another
			// user's FIFO or a device, whose open or read never ends.
			f, err := procfs.OpenInput(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			in := bufio.NewReader(f)
			if b, _ := in.Peek(1); len(b) == 1 && b[0] == '{' {
				return fmt.Errorf("%s: a JSON trace; replay reads Perfetto traces (hotpatch trace --format perfetto)", args[0])
			}
			if err := report.ReplayPerfetto(in, report.NewTextSink(stdout)); err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			return nil
		},
	}
	return cmd
}
func newProfileCmd(stdout, stderr io.Writer, inj *injectFlags) *cobra.Command {
	var (
		tf       targetFlags
		sel      selection
		duration time.Duration
		epoch    time.Duration
		samples  uint64
		hitCost  float64
		output   string
		top      int
	)
	cmd := &cobra.Command{
		Use:   "profile --pid N [--enable SEL] --duration D [--samples K --epoch E] -o FILE",
		Short: "Bursty latency profile: at most K timed calls per function per epoch",
		Long: `profile is the bursty latency profiler of "Living on the edge" (section 9): every
selected function records calls and latency until it has K samples in the current epoch.
The runtime enforces the quota at the hook, exactly, across threads, however late the
profiler looks; the profiler turns a full function's probes off until the next epoch,
which only saves the target the cost of the calls it would skip. While a profile runs,
every probed function of the process is held to the quota.

The profile is written in pprof format (go tool pprof -top FILE ranks functions by total
latency; -sample_index=calls by calls), with a text summary on stdout: the functions, the
toggles per second performed, and the target's estimated slowdown: the hooks that ran
(recorded and skipped) x the cost of one hook / the target's CPU time. The cost of a hook
is measured in the target while the profile runs (the runtime times a sample of its hooks;
the call into the hook itself is not included), unless --hit-cost gives one.`,
		Example: `  hotpatch profile --pid 4242 --duration 10s -o app.pprof
  hotpatch profile --pid 4242 --enable 'http_*' --samples 100 --epoch 50ms --duration 5s -o http.pprof`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := tf.check(); err != nil {
				return err
			}
			if output == "" || duration <= 0 || epoch <= 0 || samples == 0 {
				return usagef("profile needs -o FILE and positive --duration, --epoch and --samples")
			}
			sels, err := sel.parse()
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			if _, err := ensureRuntime(ctx, tf.pid, inj, false, stderr, tf.probes, sels); err != nil {
				return classify(err)
			}
			progress := progressTo(stderr, "profiling")
			start := time.Now()
			res, err := capture.Profile(ctx, capture.ProfileOptions{
				Options: capture.Options{PID: tf.pid, ProbeFiles: tf.probes, Selectors: sels, Duration: duration, Progress: progress},
				Samples: samples, Epoch: epoch, HitCostNs: hitCost,
			})
			endProgress(stderr, progress)
			if err != nil {
				return classify(err)
			}
			for _, n := range res.Notes {
				fmt.Fprintf(stderr, "hotpatch: profile: %s\n", n)
			}
			var buf bytes.Buffer
			if err := report.WriteProfile(&buf, report.Profile(res.Functions, start, res.Duration)); err != nil {
				return err
			}
			if err := probelist.WriteFileAtomic(output, buf.Bytes(), 0o644); err != nil {
				return err
			}
			if n := capture.QuotaHeldNote(res.QuotaHeld, samples); n != "" {
				fmt.Fprintf(stderr, "hotpatch: profile: %s\n", n)
			}
			st := &report.Stats{PID: tf.pid, Functions: res.Functions}
			st.Sort("total")
			st.Top(top)
			if tf.json {
				return writeJSON(stdout, map[string]any{"output": output, "functions": st.Functions, "epochs": res.Epochs,
					"toggles": res.Toggles, "toggles_per_sec": res.TogglesPerSec, "calls": res.Calls, "hooks": res.Hooks,
					"hit_cost_ns": res.HitCostNs, "hit_cost_from": res.HitCostFrom,
					"target_cpu_ns": res.TargetCPU.Nanoseconds(), "estimated_slowdown": res.Slowdown, "duration_ns": res.Duration.Nanoseconds(),
					"quota_held": res.QuotaHeld})
			}
			if err := st.WriteTable(stdout); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "%s: %d epochs of %s, %d probed calls, %.0f site toggles/s; target CPU %s, estimated slowdown %.2f%% (%d hooks x %.1f ns, %s)\n",
				output, res.Epochs, epoch, res.Calls, res.TogglesPerSec, res.TargetCPU.Round(time.Millisecond), 100*res.Slowdown,
				res.Hooks, res.HitCostNs, res.HitCostFrom)
			return nil
		},
	}
	tf.register(cmd)
	sel.register(cmd, "profile the functions `SEL` selects (repeatable; default '*')")
	cmd.Flags().DurationVar(&duration, "duration", 0, "how long to profile")
	cmd.Flags().DurationVar(&epoch, "epoch", 100*time.Millisecond, "quota period E")
	cmd.Flags().Uint64Var(&samples, "samples", 1000, "calls K a function may record per epoch")
	cmd.Flags().Float64Var(&hitCost, "hit-cost", 0, "cost in ns of one hook for the slowdown estimate (0: measured in the target while profiling)")
	cmd.Flags().StringVarP(&output, "output", "o", "", "write the pprof profile to `FILE`")
	cmd.Flags().IntVar(&top, "top", 20, "rows in the text summary (0: all)")
	return cmd
}

// dropMessage says which threads lost events and the flag that keeps them.
func dropMessage(res *capture.TraceResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d events dropped by full rings (", res.Dropped)
	n := 0
	for _, t := range res.Threads {
		if t.Dropped == 0 {
			continue
		}
		if n == 4 {
			b.WriteString(", ...")
			break
		}
		if n > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "thread %d: %d of %d", t.Tid, t.Dropped, t.Events+t.Dropped)
		n++
	}
	fmt.Fprintf(&b, ") with rings of %d events", res.RingEvents)
	switch s := res.SuggestRing(); {
	case s > res.RingEvents:
		fmt.Fprintf(&b, "; --ring-events %d keeps them", s)
		if s == res.RingCapacity {
			fmt.Fprintf(&b, " (the most this process reserved: EDGEPROBE_RING_MAX at its start allows more)")
		}
	default:
		fmt.Fprintf(&b, ", the most this process reserved: start it with EDGEPROBE_RING_MAX=%d for bigger rings, or trace fewer functions", 2*uint64(res.RingCapacity))
	}
	return b.String()
}
