package cli

import (
	"encoding/json"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/capture"
	"github.com/edgeprobe/edgeprobe/internal/report"
)

func newTopCmd(stdout, stderr io.Writer, inj *injectFlags) *cobra.Command {
	var (
		tf       targetFlags
		sel      selection
		interval time.Duration
		count    int
		rows     int
	)
	cmd := &cobra.Command{
		Use:   "top --pid N [--enable SEL] [--interval D] [--count K] [--json]",
		Short: "Watch per-function calls/s and latency percentiles live",
		Long: `top reads the runtime's per-function counters every interval and shows what each
function did during it: calls per second, mean, p50 and p99 latency (from the log2
histograms, exact to within a factor of two, like stats), and its calls so far, busiest
first. On a terminal the table refreshes in place; in a pipe each interval is printed
as plain lines, and with --json as one JSON object per line.

Without --enable it only reads: it changes nothing in the process and takes no lock. With
--enable it turns those probes on while it runs (holding the process's hotpatch lock)
and puts them back when it stops (Ctrl-C, --count, or the process exiting).`,
		Example: `  hotpatch top --pid 4242
  hotpatch top --pid 4242 --enable 'handle_*' --interval 500ms
  hotpatch top --pid 4242 --count 10 --json | jq '.functions[0]'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := tf.check(); err != nil {
				return err
			}
			if interval <= 0 || count < 0 {
				return usagef("top needs a positive --interval and --count of 0 or more")
			}
			sels, err := sel.parse()
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			if _, err := ensureRuntime(ctx, tf.pid, inj, false, stderr, nil, nil); err != nil {
				return classify(err)
			}
			height, live := terminalHeight(stdout)
			show := func(s *report.TopSnapshot) error {
				switch {
				case tf.json:
					return writeJSONLine(stdout, s)
				case live:
					// Home, then clear: the table replaces the last one.
					io.WriteString(stdout, "\x1b[H\x1b[2J")
					n := rows
					if n <= 0 || n > height-3 {
						n = max(height-3, 1)
					}
					return s.WriteTable(stdout, n)
				default:
					if err := s.WriteTable(stdout, rows); err != nil {
						return err
					}
					_, err := io.WriteString(stdout, "\n")
					return err
				}
			}
			err = capture.Top(ctx, capture.Options{PID: tf.pid, ProbeFiles: tf.probes, Selectors: sels}, interval, count, show)
			return classify(err)
		},
	}
	tf.register(cmd)
	sel.register(cmd, "turn on the probes `SEL` selects while watching (repeatable; default: watch what is on)")
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "time between refreshes")
	cmd.Flags().IntVar(&count, "count", 0, "stop after this many intervals (0: until interrupted)")
	cmd.Flags().IntVar(&rows, "rows", 0, "functions shown per interval (0: all; on a terminal, what fits)")
	return cmd
}

// terminalHeight reports whether w is a terminal, and its height in rows.
func terminalHeight(w io.Writer) (int, bool) {
	f, ok := w.(*os.File)
	if !ok {
		return 0, false
	}
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0, false
	}
	return int(ws.Row), true
}

// writeJSONLine writes v as one line of JSON (a stream a script reads line
// by line).
func writeJSONLine(w io.Writer, v any) error { return json.NewEncoder(w).Encode(v) }
