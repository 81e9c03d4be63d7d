package cli

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeprobe/edgeprobe/internal/calibrate"
)

func newCalibrateCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		waits   []time.Duration
		toggles int
		threads int
		output  string
		asJSON  bool
		dryRun  bool
	)
	cmd := &cobra.Command{
		Use:   "calibrate [--waits LIST] [--toggles N] [--threads N] [--output FILE] [--json]",
		Short: "Measure the int3 protocol's wait on this machine (the paper's T_max test)",
		Long: `calibrate is the installation-time test of "Living on the edge" (section 8.1): a bundled
target runs executor threads through call sites at every cache-line straddle split
(1|4, 2|3, 3|2, 4|1) while calibrate toggles them with the int3 protocol at a sweep of
waits. The target catches torn instructions (SIGILL/SIGSEGV/SIGTRAP) and reports their
bytes; a crash of the target is counted and it is restarted. The same stress runs with
flip and with int3+Sync as controls.

The result is the smallest wait with zero failures at it and every larger wait, times a
safety margin, saved where hotpatch --protocol int3 reads it:
$EDGEPROBE_CALIBRATION, else /var/lib/edgeprobe/calibration.json (root) or
$XDG_STATE_HOME/edgeprobe/calibration.json. A sweep that finds no safe wait saves nothing
and exits 1. hotpatch keeps its per-phase Sync (every thread passes through the kernel)
whatever the wait: the calibrated wait shortens the protocol, it is not its only guard.`,
		Example: `  hotpatch calibrate
  hotpatch calibrate --toggles 200000 --waits 0,250ns,1us,10us
  hotpatch calibrate --json --output /tmp/calibration.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signalContext()
			defer stop()
			progress := progressTo(stderr, "calibrating")
			opts := calibrate.Options{Waits: waits, TogglesPerPoint: toggles, Threads: threads}
			if progress != nil {
				opts.Progress = func(p calibrate.Progress) {
					progress(p.Elapsed, fmt.Sprintf("point %d/%d (%s, wait %s, split %s): %d toggles, %d failures",
						p.Index+1, p.Total, p.Point.Variant, time.Duration(p.Point.WaitNs), p.Point.Split, p.Point.Toggles, p.Point.Failures))
				}
			}
			res, err := calibrate.Run(ctx, opts)
			endProgress(stderr, progress)
			if err != nil {
				return err
			}
			if asJSON {
				b, err := res.Marshal()
				if err != nil {
					return err
				}
				stdout.Write(append(b, '\n'))
			} else if err := res.WriteTable(stdout); err != nil {
				return err
			}
			if dryRun {
				return nil
			}
			path := output
			if path == "" {
				path = calibrate.DefaultPath()
			}
			if err := res.Save(path); err != nil {
				if errors.Is(err, calibrate.ErrNoSafeWait) {
					return fmt.Errorf("no wait in the sweep was free of failures; nothing saved (%w)", err)
				}
				return err
			}
			if !asJSON {
				fmt.Fprintf(stdout, "saved to %s\n", path)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationSliceVar(&waits, "waits", nil, "waits to sweep, e.g. 0,100ns,1us (default 0,100ns,250ns,500ns,1µs,2µs,5µs,10µs,50µs)")
	f.IntVar(&toggles, "toggles", 0, "toggles per (wait, split) point (default 20000)")
	f.IntVar(&threads, "threads", 0, "executor threads in the target (default: CPUs, at least 2)")
	f.StringVarP(&output, "output", "o", "", "save to `FILE` instead of the default path")
	f.BoolVar(&asJSON, "json", false, "print the full result as JSON instead of a table")
	f.BoolVarP(&dryRun, "dry-run", "n", false, "measure and print, save nothing")
	return cmd
}

// int3Wait is the wait the int3 protocols use when --int3-wait is not
// given: the calibrated one, else xmod's conservative default (returned as
// 0). A corrupt calibration is an error only when int3 was asked for by
// name; for auto, which may not need int3 at all, it is a warning.
func int3Wait(protocol string, stderr io.Writer) (time.Duration, error) {
	if protocol != "int3" && protocol != "int3-async" && protocol != "auto" {
		return 0, nil
	}
	d, ok, err := calibrate.Load("")
	switch {
	case err != nil && protocol == "auto":
		fmt.Fprintf(stderr, "hotpatch: warning: %v; int3 sites use the default wait\n", err)
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("%w (run hotpatch calibrate, or pass --int3-wait)", err)
	case !ok:
		return 0, nil
	}
	return d, nil
}
