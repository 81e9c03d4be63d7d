package cli

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
	"github.com/edgeprobe/edgeprobe/internal/coldpatch"
	"github.com/edgeprobe/edgeprobe/internal/elfscan"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
)

// ColdpatchMain runs the coldpatch command and returns its exit code.
func ColdpatchMain(args []string, stdout, stderr io.Writer) int {
	return run(newColdpatchCmd(stdout, stderr), args, stdout, stderr)
}

func newColdpatchCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		output, placeholder, completion string
		summary, dryRun, quiet          bool
	)
	cmd := &cobra.Command{
		Use:   "coldpatch [flags] BINARY",
		Short: "Make every -finstrument-functions and -pg -mfentry hook site of an ELF binary inert and print its probe list",
		Long: `coldpatch finds every compiler-inserted call or tail jump to __cyg_profile_func_enter,
__cyg_profile_func_exit and __cyg_profile_func_enter_bare (provider "cyg",
-finstrument-functions) and every call to __fentry__ at a function's entry (provider
"fentry", compiled with -pg -mfentry and linked without -pg) in an x86-64 ELF executable or
shared library (PIE, non-PIE, static, stripped), rewrites each into an inert placeholder,
and prints the probe list (JSON) that hotpatch uses to turn them back on in a running process.

BINARY is rewritten in place, like strip (through a temporary file and a rename; owner,
group, mode and extended attributes kept where it may), unless -o names another file. Only
the ELF header is read before BINARY is known to be a regular file and an x86-64 ELF
object. A symlink is followed and the file it names is patched, except one another user owns
in a sticky world-writable directory such as /tmp (as fs.protected_symlinks would refuse
it); a file with other hard links is refused (the
other names would keep the old binary): patch a copy with -o. Running coldpatch again on a cold binary changes
nothing and prints the same list. The default "flip" placeholder differs from the active
call in one byte, so hotpatch toggles it with one atomic store.`,
		Example: `  coldpatch ./app > probes.json
  coldpatch -o app.cold --summary ./app > probes.json
  coldpatch --dry-run ./libfoo.so | jq '.probes[] | select(.function=="foo")'
  coldpatch --placeholder nop ./app > probes.json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if completion != "" {
				return nil
			}
			if len(args) != 1 {
				return usagef("want exactly one BINARY, got %d arguments (see --help)", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if completion != "" {
				return genCompletion(cmd, completion, stdout)
			}
			if placeholder != probelist.PlaceholderFlip && placeholder != probelist.PlaceholderNop {
				return usagef("--placeholder must be flip or nop, not %q", placeholder)
			}
			res, err := coldpatch.Run(args[0], coldpatch.Options{Placeholder: placeholder, Output: output, DryRun: dryRun})
			if err != nil {
				return err
			}
			if summary {
				printSummary(stderr, res)
			}
			if !quiet {
				for _, s := range res.Report.Skipped {
					fmt.Fprintf(stderr, "coldpatch: warning: %s at %#x: %s reaches %s but is not patchable: %s\n",
						calltrace.Printable(s.Container), s.Address, s.Instruction, s.Hook, s.Reason)
				}
				for _, d := range res.Report.DecodeErrors {
					fmt.Fprintf(stderr, "coldpatch: warning: %s: decoding stopped at %#x: %s\n", calltrace.Printable(d.Function), d.Address, d.Err)
				}
				warnMcountLoc(stderr, res.Report.McountLoc)
			}
			return res.List.Write(stdout)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&output, "output", "o", "", "write the cold binary to `FILE` and leave BINARY untouched")
	f.StringVar(&placeholder, "placeholder", probelist.PlaceholderFlip, "inert form: flip (one-byte toggle) or nop")
	f.BoolVar(&summary, "summary", false, "print a human summary (functions, sites by encoding, straddlers) to stderr")
	f.BoolVarP(&dryRun, "dry-run", "n", false, "scan and print the probe list without writing anything")
	f.BoolVarP(&quiet, "quiet", "q", false, "do not warn about hook references that are not patchable sites")
	f.Bool("json", true, "print the probe list as JSON on stdout (the only format; accepted for symmetry with hotpatch)")
	f.StringVar(&completion, "completion", "", "print a shell completion script for `SHELL` (bash, zsh, fish) and exit")
	_ = cmd.RegisterFlagCompletionFunc("placeholder", cobra.FixedCompletions([]string{"flip", "nop"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func genCompletion(cmd *cobra.Command, shell string, w io.Writer) error {
	switch shell {
	case "bash":
		return cmd.GenBashCompletionV2(w, true)
	case "zsh":
		return cmd.GenZshCompletion(w)
	case "fish":
		return cmd.GenFishCompletion(w, true)
	}
	return usagef("--completion: unknown shell %q (bash, zsh, fish)", shell)
}

// warnMcountLoc reports where gcc's __mcount_loc table and the fentry
// probes disagree; the probe list keeps what the decode found.
func warnMcountLoc(w io.Writer, c *elfscan.McountLocCheck) {
	if c.OK() {
		return
	}
	if c.Err != "" {
		fmt.Fprintf(w, "coldpatch: warning: __mcount_loc: %s\n", c.Err)
		return
	}
	for _, a := range c.NotSites {
		fmt.Fprintf(w, "coldpatch: warning: __mcount_loc lists %#x, where no fentry site was found\n", a)
	}
	for _, a := range c.Unlisted {
		fmt.Fprintf(w, "coldpatch: warning: fentry site at %#x is not listed in __mcount_loc\n", a)
	}
}

func printSummary(w io.Writer, res *coldpatch.Result) {
	l := res.List
	byEnc := map[string]int{}
	byProvider := map[string]int{}
	funcs := map[string]bool{}
	var straddlers, unresolved, entries, nops int
	for i := range l.Probes {
		p := &l.Probes[i]
		byEnc[p.Encoding]++
		byProvider[p.Provider]++
		funcs[p.Function] = true
		if p.Straddle != "" {
			straddlers++
		}
		if !p.Resolved {
			unresolved++
		}
		if p.Kind == probelist.KindEntry {
			entries++
		}
		if p.Placeholder == probelist.PlaceholderNop {
			nops++
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "binary\t%s\n", calltrace.Printable(l.Binary.Path))
	fmt.Fprintf(tw, "functions decoded\t%d (from %s)\n", res.Report.Functions, res.Report.FunctionSource)
	fmt.Fprintf(tw, "probed functions\t%d\n", len(funcs))
	fmt.Fprintf(tw, "sites\t%d (%d entry, %d exit)\n", len(l.Probes), entries, len(l.Probes)-entries)
	for _, prov := range []string{probelist.ProviderCyg, probelist.ProviderFentry} {
		if byProvider[prov] > 0 {
			fmt.Fprintf(tw, "  provider %s\t%d\n", prov, byProvider[prov])
		}
	}
	encs := make([]string, 0, len(byEnc))
	for e := range byEnc {
		encs = append(encs, e)
	}
	sort.Strings(encs)
	for _, e := range encs {
		fmt.Fprintf(tw, "  %s\t%d\n", e, byEnc[e])
	}
	fmt.Fprintf(tw, "straddling a cache line\t%d\n", straddlers)
	fmt.Fprintf(tw, "nop placeholders\t%d\n", nops)
	fmt.Fprintf(tw, "function not recovered\t%d\n", unresolved)
	fmt.Fprintf(tw, "skipped references\t%d\n", len(res.Report.Skipped))
	if c := res.Report.McountLoc; c != nil {
		fmt.Fprintf(tw, "__mcount_loc\t%d entries, %d fentry sites, %d zero, %d not sites, %d sites unlisted\n",
			c.Entries, c.Matched, c.Zero, len(c.NotSites), len(c.Unlisted))
	}
	fmt.Fprintf(tw, "patched now\t%d\n", res.Patched)
	tw.Flush()
}
