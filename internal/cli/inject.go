package cli

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
	"github.com/edgeprobe/edgeprobe/internal/hotpatch"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
)

// injectFlags are --no-inject and --runtime, shared by every command that
// needs the runtime in the target (enable, stats, trace, profile, top).
type injectFlags struct {
	noInject bool
	runtime  string
	verbose  bool
}

func (f *injectFlags) register(cmd *cobra.Command) {
	pf := cmd.PersistentFlags()
	pf.BoolVar(&f.noInject, "no-inject", false, "never load the runtime into the target: a process without it is an error")
	pf.StringVar(&f.runtime, "runtime", "", "the runtime `FILE` to load into a process started without it (default: $"+hotpatch.EnvRuntime+", else "+hotpatch.RuntimeFile+" next to hotpatch)")
}

// ensureRuntime makes sure pid's probes record into the runtime, loading it
// if need be (docs/injection.md), and prints its one-line note on stderr.
// sels, when any, are what the command will enable on the lists in probes
// (none: a scan): a load is not made for a command those refuse (D83).
func ensureRuntime(ctx context.Context, pid int, f *injectFlags, waitLock bool, stderr io.Writer, probes []string, sels []probelist.Selector) (*hotpatch.RuntimeStatus, error) {
	actions := make([]hotpatch.Action, len(sels))
	for i, s := range sels {
		actions[i] = hotpatch.Action{Enable: true, Selector: s}
	}
	opts := hotpatch.RuntimeOptions{NoInject: f.noInject, File: f.runtime, WaitLock: waitLock}.ForRequest(pid, probes, actions)
	st, err := hotpatch.EnsureRuntime(ctx, pid, opts)
	reportRuntime(st, f, stderr)
	return st, err
}

// reportRuntime prints what EnsureRuntime did: its note, and with -v the
// slots left alone and how the load went.
func reportRuntime(st *hotpatch.RuntimeStatus, f *injectFlags, stderr io.Writer) {
	if st != nil {
		if st.Note != "" {
			fmt.Fprintln(stderr, st.Note)
		}
		if f.verbose {
			for _, s := range st.Foreign {
				fmt.Fprintf(stderr, "left alone: %s calls %s defined by %s (the program's own hook)\n", calltrace.Printable(filepath.Base(s.Object)), s.Hook, calltrace.Printable(filepath.Base(s.Target)))
			}
			if st.Load != nil {
				fmt.Fprintf(stderr, "load: borrowed thread %d (system call %d) for %v after %d stops; %d slots; %v in all\n", st.Load.Tid, st.Load.Syscall, st.Load.Borrowed, st.Load.Tries, st.Load.Entries, st.Load.Elapsed)
			}
		}
	}
}
