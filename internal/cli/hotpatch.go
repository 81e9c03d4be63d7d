package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
	"github.com/edgeprobe/edgeprobe/internal/hotpatch"
	"github.com/edgeprobe/edgeprobe/internal/phases"
	"github.com/edgeprobe/edgeprobe/internal/probecache"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
)

// HotpatchMain runs the hotpatch command and returns its exit code.
func HotpatchMain(args []string, stdout, stderr io.Writer) int {
	phases.Mark("start")
	cmd := newHotpatchCmd(stdout, stderr)
	if !mayComplete(args) {
		// cobra builds its completion command (five subcommands with
		// their help) on every Execute; a toggle never reaches it.
		cmd.CompletionOptions.DisableDefaultCmd = true
	}
	code := run(cmd, args, stdout, stderr)
	phases.Mark("end")
	phases.Print(stderr)
	return code
}

// actionFlag appends to a shared list, so --enable and --disable keep the
// order they were given in: later ones win for a probe both select.
type actionFlag struct {
	enable bool
	list   *[]string
}

func (a actionFlag) String() string { return "" }
func (a actionFlag) Type() string   { return "SEL" }
func (a actionFlag) Set(v string) error {
	verb := "-"
	if a.enable {
		verb = "+"
	}
	*a.list = append(*a.list, verb+v)
	return nil
}

type targetFlags struct {
	pid    int
	probes []string
	json   bool
}

func (f *targetFlags) register(cmd *cobra.Command) {
	cmd.Flags().IntVarP(&f.pid, "pid", "p", 0, "the target process")
	stringsVarP(cmd.Flags(), &f.probes, "probes", "", "probe list `FILE` from coldpatch (repeatable, one per object); default: scan the process's objects")
	cmd.Flags().BoolVar(&f.json, "json", false, "print the result as JSON on stdout")
	_ = cmd.RegisterFlagCompletionFunc("pid", cobra.NoFileCompletions)
}

func (f *targetFlags) check() error {
	if f.pid <= 0 {
		return usagef("--pid is required (a positive process id)")
	}
	return nil
}

func newHotpatchCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		tf             targetFlags
		actions        []string
		kind, protocol string
		provider       string
		waitLock       bool
		verbose        bool
		wait           time.Duration
		commands       string
		inj            injectFlags
	)
	cmd := &cobra.Command{
		Use:   "hotpatch --pid N (--enable SEL | --disable SEL)... [flags]",
		Short: "Turn probes on and off in a running process without stopping it",
		Long: `hotpatch enables and disables probes in a running, multi-threaded process by
cross-modifying its code through /proc/PID/mem while every thread keeps running. Probes are
the hook calls compilers insert: -finstrument-functions (provider cyg: entry and exit
sites) and -pg -mfentry (provider fentry: one entry site per function; the runtime
produces its exits).

SEL is a function name, a glob ('http_*', '*') or id:N. A name selects every copy of the
function, including its hook calls inlined into other functions. --enable and --disable
may be repeated and mixed; a later one wins for a probe both select.

Without --probes, hotpatch scans every instrumented object the process maps (the
executable and its shared libraries), so any -finstrument-functions binary works, cold or
not. With --probes it uses coldpatch's lists and checks each against the mapped object.
Both are kept in a private per-user cache, so a second call neither parses nor scans:
$EDGEPROBE_CACHE (off to disable), else /var/cache/edgeprobe for root, ~/.cache/edgeprobe
for others (docs/probe-list.md); -v prints its hits and misses. Every site's live bytes
are verified before anything is written; a site holding anything but its active or inert
form refuses the whole request.

A process started without the runtime (no LD_PRELOAD=libedgeprobe.so) gets it loaded by the
first --enable (and by stats, trace, profile, top): one line on stderr says so. --no-inject
refuses instead; --runtime FILE or $EDGEPROBE_RUNTIME names the runtime, else libedgeprobe.so
next to hotpatch. See docs/injection.md.

Protocols: flip (one atomic byte store, no stop; the default wherever a site allows it),
int3 and int3-async (multi-byte sites: int3 first, threads that hit it are held by
hotpatch as tracer), stop (stop the world; the iProbe/Dyninst baseline). See
docs/protocols.md.

A site left holding an int3 by a hotpatch that was killed mid-batch (SIGKILL cannot be
caught) is recognised as ours and made whole before the request runs, with a message;
'hotpatch repair --pid N' does the same for every site at once.

Exit status: 0 every selected site ended in the asked state; 1 failure (permission,
stale probe list, interrupted); 2 usage; 3 a selector matched no probe; 4 the process does
not exist or exited while hotpatch worked on it.`,
		Example: `  hotpatch --pid 4242 --enable handle_request
  hotpatch --pid 4242 --probes probes.json --enable 'http_*' --kind entry
  hotpatch --pid 4242 --disable '*' --json
  hotpatch list --pid 4242`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			phases.Mark("cobra")
			if err := tf.check(); err != nil {
				return err
			}
			if commands != "" {
				if len(actions) > 0 {
					return usagef("--commands takes its enables and disables from its input, not from --enable/--disable")
				}
				in := cmd.InOrStdin()
				if commands != "-" {
					// Ours or root's, a regular file or a FIFO: never another
					// user's content choosing what we do (D93).
					f, err := procfs.OpenOwned(commands)
					if err != nil {
						return err
					}
					defer f.Close()
					in = f
				}
				inj.verbose = verbose
				return runSession(tf, protocol, waitLock, &inj, in, stdout, stderr)
			}
			if len(actions) == 0 {
				return usagef("nothing to do: give --enable SEL or --disable SEL (or a subcommand; see --help)")
			}
			switch protocol {
			case hotpatch.ProtoAuto, hotpatch.ProtoFlip, hotpatch.ProtoInt3, hotpatch.ProtoInt3Async, hotpatch.ProtoStop:
			default:
				return usagef("--protocol must be auto, flip, int3, int3-async or stop, not %q", protocol)
			}
			if !cmd.Flags().Changed("int3-wait") {
				d, err := int3Wait(protocol, stderr)
				if err != nil {
					return err
				}
				wait = d
			}
			prov, err := probelist.ParseProvider(provider)
			if err != nil {
				return usageError{err}
			}
			req := hotpatch.Request{PID: tf.pid, ProbeFiles: tf.probes, Protocol: protocol, Int3Wait: wait, WaitLock: waitLock,
				Brief: !tf.json && !verbose} // the sites are printed only with --json or -v
			for _, a := range actions {
				sel, err := probelist.ParseSelector(a[1:], kind)
				if err != nil {
					return usageError{err}
				}
				sel.Provider = prov
				req.Actions = append(req.Actions, hotpatch.Action{Enable: a[0] == '+', Selector: sel})
			}
			ctx, stop := signalContext()
			defer stop()
			phases.Mark("signals")
			for _, a := range req.Actions {
				if a.Enable {
					// An enable makes sure the probes record into the
					// runtime first (loading it if need be), under the
					// request's own lock.
					inj.verbose = verbose
					req.Runtime = &hotpatch.RuntimeOptions{NoInject: inj.noInject, File: inj.runtime, WaitLock: waitLock}
					req.OnRuntime = func(st *hotpatch.RuntimeStatus) { reportRuntime(st, &inj, stderr) }
					break
				}
			}
			res, err := hotpatch.Apply(ctx, req)
			phases.Mark("detach")
			if res != nil {
				for _, n := range res.Repaired {
					fmt.Fprintf(stderr, "hotpatch: %s\n", calltrace.Printable(n.String()))
				}
				for _, w := range res.Warnings {
					fmt.Fprintf(stderr, "hotpatch: warning: %s\n", calltrace.Printable(w))
				}
				if tf.json {
					if werr := writeJSON(stdout, res); werr != nil && err == nil {
						err = werr
					}
				} else if verbose {
					printSites(stderr, res)
				}
			}
			if verbose {
				if c, _ := probecache.Default(); c != nil {
					hits, misses := c.Stats()
					fmt.Fprintf(stderr, "probe cache %s: %d hits, %d misses\n", c.Path(), hits, misses)
				}
			}
			if err != nil {
				return classify(err)
			}
			if !res.OK {
				return fmt.Errorf("some sites did not reach the asked state (sites now: %s; -v lists them)", hotpatch.Tally(res.Sites))
			}
			return nil
		},
	}
	tf.register(cmd)
	// The commands that load targets read the probe cache: say once when it
	// cannot be used because its directory is not private.
	cmd.PersistentPreRun = func(c *cobra.Command, _ []string) {
		switch c.Name() {
		case "hotpatch", "list", "trace", "profile", "session":
			warnCache(stderr, verbose)
		}
	}
	f := cmd.Flags()
	f.VarP(actionFlag{true, &actions}, "enable", "e", "turn on the probes `SEL` selects (repeatable)")
	f.VarP(actionFlag{false, &actions}, "disable", "d", "turn off the probes `SEL` selects (repeatable)")
	f.StringVar(&kind, "kind", "both", "which probes of a function: entry, exit or both (fentry probes are entries; their exits come from the runtime)")
	f.StringVar(&provider, "provider", probelist.ProviderAll, "which providers' probes: cyg (-finstrument-functions), fentry (-pg -mfentry) or all")
	f.StringVar(&protocol, "protocol", hotpatch.ProtoAuto, "auto, flip, int3, int3-async or stop")
	f.DurationVar(&wait, "int3-wait", 0, "wait between int3 phases (default: from hotpatch calibrate, else 50µs)")
	f.BoolVar(&waitLock, "wait", false, "if another hotpatch works on the process, wait for it instead of failing")
	f.BoolVarP(&verbose, "verbose", "v", false, "print every site's result to stderr")
	f.StringVar(&commands, "commands", "", "run the commands of `FILE` (yours or root's, a regular file or FIFO; '-': stdin) over one attach, as hotpatch session does")
	_ = cmd.RegisterFlagCompletionFunc("kind", cobra.FixedCompletions([]string{"entry", "exit", "both"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("provider", cobra.FixedCompletions([]string{"cyg", "fentry", "all"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("protocol", cobra.FixedCompletions([]string{"auto", "flip", "int3", "int3-async", "stop"}, cobra.ShellCompDirectiveNoFileComp))
	inj.register(cmd)
	cmd.AddCommand(newListCmd(stdout), newStatsCmd(stdout, stderr, &inj), newTraceCmd(stdout, stderr, &inj), newReplayCmd(stdout), newTopCmd(stdout, stderr, &inj), newProfileCmd(stdout, stderr, &inj), newCalibrateCmd(stdout, stderr), newRepairCmd(stdout, stderr), newSessionCmd(stdout, stderr, &inj))
	return cmd
}

func newListCmd(stdout io.Writer) *cobra.Command {
	var tf targetFlags
	cmd := &cobra.Command{
		Use:   "list --pid N [--probes FILE]... [--json]",
		Short: "Show every probe of a process with its live state",
		Long: `list reads every probe site's bytes from the running process, without attaching or
stopping anything, and shows its state: on, off, mid-patch (an int3 of a patch in
progress) or foreign (neither form: a stale probe list, or someone else's patch).`,
		Example: `  hotpatch list --pid 4242
  hotpatch list --pid 4242 --json | jq '.[] | select(.state=="on") | .function'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := tf.check(); err != nil {
				return err
			}
			states, err := hotpatch.Status(tf.pid, tf.probes)
			if err != nil {
				return classify(err)
			}
			if tf.json {
				return writeJSON(stdout, states)
			}
			tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tPROVIDER\tKIND\tFUNCTION\tADDRESS\tOBJECT\tSOURCE")
			for _, s := range states {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.State, s.Provider, s.Kind,
					calltrace.Printable(s.Function), s.Address, calltrace.Printable(shortPath(s.Object)), calltrace.Printable(s.Source))
			}
			return tw.Flush()
		},
	}
	tf.register(cmd)
	return cmd
}

// warnCache reports a probe cache that is not used for a reason the user
// should know (a directory that is not private), and with -v every entry
// it ignores.
func warnCache(stderr io.Writer, verbose bool) {
	c, err := probecache.Default()
	if errors.Is(err, probecache.ErrUnsafe) {
		fmt.Fprintf(stderr, "hotpatch: warning: %v: probe lists and scans are not cached\n", err)
	}
	if verbose {
		c.SetWarn(func(format string, args ...any) { fmt.Fprintf(stderr, "hotpatch: "+format+"\n", args...) })
	}
}

func printSites(w io.Writer, res *hotpatch.Result) {
	for _, s := range res.Sites {
		mark := "ok"
		if s.After != s.Want {
			mark = "FAILED"
		}
		fmt.Fprintf(w, "%-6s %s %-5s %s at %s: %s -> %s (%s)\n", mark, calltrace.Printable(shortPath(s.Object)), s.Kind, calltrace.Printable(s.Function), s.Address, s.Before, s.After, s.Protocol)
	}
	fmt.Fprintf(w, "%d changed, %d already so, %d threads held, %.3f ms\n", res.Changed, res.Unchanged, res.Held, float64(res.ElapsedNS)/1e6)
}

func shortPath(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// classify gives errors the exit code a script expects.
func classify(err error) error {
	switch {
	case errors.Is(err, probelist.ErrNoMatch):
		return codedError{err, ExitNoMatch}
	case hotpatch.Gone(err):
		return codedError{err, ExitGone}
	}
	return err
}

func newRepairCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		tf   targetFlags
		wait time.Duration
	)
	cmd := &cobra.Command{
		Use:   "repair --pid N [--probes FILE]...",
		Short: "Make whole every probe site an interrupted hotpatch left holding an int3",
		Long: `repair reads every probe site of the process and restores each one that holds an int3
over bytes of its own forms (what a hotpatch killed mid-batch by SIGKILL leaves behind) to a
whole form: the one its other bytes already are, else off. Threads that reach such a site
meanwhile are held by repair as tracer and resume at the site once it is whole. Sites in
neither form are left alone ('hotpatch list' shows them as foreign). Prints one line per
repaired site, or "nothing to repair".`,
		Example: `  hotpatch repair --pid 4242`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := tf.check(); err != nil {
				return err
			}
			if !cmd.Flags().Changed("int3-wait") {
				d, err := int3Wait(hotpatch.ProtoInt3, stderr)
				if err != nil {
					return err
				}
				wait = d
			}
			ctx, stop := signalContext()
			defer stop()
			s, err := hotpatch.Open(tf.pid, tf.probes, false)
			if err != nil {
				return classify(err)
			}
			notes, err := s.Repair(ctx, wait)
			if cerr := s.Close(); err == nil {
				err = cerr
			}
			if tf.json {
				if notes == nil {
					notes = []hotpatch.RepairNote{}
				}
				if werr := writeJSON(stdout, notes); werr != nil && err == nil {
					err = werr
				}
			} else {
				for _, n := range notes {
					fmt.Fprintln(stdout, calltrace.Printable(n.String()))
				}
				if len(notes) == 0 && err == nil {
					fmt.Fprintln(stdout, "nothing to repair")
				}
			}
			if err != nil {
				return classify(err)
			}
			return nil
		},
	}
	tf.register(cmd)
	cmd.Flags().DurationVar(&wait, "int3-wait", 0, "wait before the last write (default: from hotpatch calibrate, else 50µs)")
	return cmd
}

// mayComplete reports whether args may reach cobra's completion or help
// commands, or list the commands: anything but flags first, or any word
// that names one of them.
func mayComplete(args []string) bool {
	if len(args) == 0 || !strings.HasPrefix(args[0], "-") {
		return true
	}
	for _, a := range args {
		switch a {
		case "completion", "__complete", "__completeNoDesc", "help", "-h", "--help":
			return true
		}
	}
	return false
}
