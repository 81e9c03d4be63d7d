package calibrate

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WaitString formats a wait for people: "none" for zero.
func WaitString(d time.Duration) string {
	if d == 0 {
		return "none"
	}
	return d.String()
}

// WriteTable writes the sweep as a human table (failures/toggles per wait
// and split, one block per variant; "!" marks a point where the target
// died), then the choice.
func (r *Result) WriteTable(w io.Writer) error {
	var splits []string
	seenSplit := map[string]bool{}
	for _, p := range r.Sweep {
		if !seenSplit[p.Split] {
			seenSplit[p.Split] = true
			splits = append(splits, p.Split)
		}
	}
	fmt.Fprintf(w, "machine: %s, kernel %s, %d CPUs; load average %s at start, %s at end; %d executor threads\n",
		orDash(r.Machine.CPUModel), orDash(r.Machine.Kernel), r.Machine.NProc, orDash(r.Machine.LoadStart), orDash(r.Machine.LoadEnd), r.Threads)
	blocks := []struct{ variant, title string }{
		{VariantInt3, "int3, time wait only (NoSync): the calibrated protocol"},
		{VariantInt3Sync, "int3 with Sync (control: the wait is not what makes it safe)"},
		{VariantFlip, "flip, one byte (control: expected 0)"},
	}
	crashed := false
	for _, b := range blocks {
		var rows []int64
		cells := map[int64]map[string]Point{}
		for _, p := range r.Sweep {
			if p.Variant != b.variant {
				continue
			}
			if cells[p.WaitNs] == nil {
				cells[p.WaitNs] = map[string]Point{}
				rows = append(rows, p.WaitNs)
			}
			cells[p.WaitNs][p.Split] = p
		}
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s: failures/toggles\n", b.title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		head := []string{"wait"}
		for _, s := range splits {
			head = append(head, "split "+s)
		}
		head = append(head, "held", "stale", "µs/toggle")
		fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
		for _, wns := range rows {
			row := []string{WaitString(time.Duration(wns))}
			if b.variant == VariantFlip {
				row[0] = "-"
			}
			held, stale, toggles, elapsed := 0, uint64(0), 0, int64(0)
			for _, s := range splits {
				p, ok := cells[wns][s]
				if !ok {
					row = append(row, "")
					continue
				}
				cell := fmt.Sprintf("%d/%d", p.Failures, p.Toggles)
				if p.Crashes > 0 {
					cell += "!"
					crashed = true
				}
				row = append(row, cell)
				held += p.Held
				stale += p.StaleTraps
				toggles += p.Toggles
				elapsed += p.ElapsedNs
			}
			per := "-"
			if toggles > 0 {
				per = fmt.Sprintf("%.1f", float64(elapsed)/float64(toggles)/1e3)
			}
			row = append(row, fmt.Sprint(held), fmt.Sprint(stale), per)
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	if crashed {
		fmt.Fprintln(w, "! the target died at least once in this point (counted as a failure; restarted)")
	}
	fmt.Fprintln(w, "held: executors caught at the int3 and resumed; stale: executors that hit an int3 after the site was complete (rewound)")
	if f := r.Failures(VariantFlip); f > 0 {
		fmt.Fprintf(w, "WARNING: flip had %d failures: one-byte stores tore, which no protocol here can survive\n", f)
	}
	if r.Safe {
		fmt.Fprintf(w, "smallest wait with zero failures there and at every larger wait (>= %d toggles per point): %v\n", r.TogglesPerPoint, time.Duration(r.BaseWaitNs))
		fmt.Fprintf(w, "  (0 failures in %d toggles at that wait: per-toggle failure rate below %.1e at 95%% confidence, no better)\n", r.BaseToggles, r.RateBound)
		fmt.Fprintf(w, "calibrated int3 wait (x%g margin): %v\n", r.Margin, r.Wait())
	} else {
		fmt.Fprintf(w, "no calibrated wait: %v\n", ErrNoSafeWait)
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
