package bench

import (
	"errors"
	"fmt"
	"strings"
)

// The README's paragraph of figures lies between these lines; benchreport
// -readme rewrites it from a full run's results, so that no figure in the
// README is typed by hand.
const (
	ReadmeBegin = "<!-- figures: written by `go run ./internal/bench/cmd/benchreport -readme README.md`; do not edit -->"
	ReadmeEnd   = "<!-- /figures -->"
)

// ErrReadmeMarkers: the README has no (or a broken) figures block.
var ErrReadmeMarkers = errors.New("README: no figures block between the markers")

// readmeKeys are the results the paragraph quotes.
var readmeKeys = []string{"invoke.runtime_count_only", "invoke.runtime", "invoke.glibc", "toggle.flip", "toggle.int3",
	"batch20k.session_spans_per_probe", "batch20k.session_spans_first_per_probe", "batch20k.probes", "throughput_ratio.10k", "throughput_ratio.100k"}

// ReadmeFigures is the README's paragraph of headline figures, from r.
func ReadmeFigures(r *Report) (string, error) {
	v := map[string]float64{}
	var missing []string
	for _, k := range readmeKeys {
		f, ok := r.Values[k].(float64)
		if !ok {
			missing = append(missing, k)
			continue
		}
		v[k] = f
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("the README's figures need %s (a full run of the invoke, toggle, batch and throughput rows)", strings.Join(missing, ", "))
	}
	return fmt.Sprintf("A probe that is off costs one `cmp` where a call stood. One that is on costs a call into the\n"+
		"runtime: %.1f ns per hook counting, %.1f ns counting and timing (glibc's empty hook: %.1f ns).\n"+
		"Toggling one from a separate process costs %.1f µs (flip: one 1-byte `pwrite` plus\n"+
		"verification), %.0f ns per probe in a %s-probe batch a session toggles back and forth (%.0f ns\n"+
		"in one call's batch); a multi-byte site's int3\n"+
		"protocol %.0f µs. A probe toggled\n"+
		"10,000 times a second leaves the target's throughput at %.2f of untoggled, 100,000 times a\n"+
		"second at %.2f. Figures, the machine and how to reproduce them: [BENCHMARKS.md](BENCHMARKS.md).",
		v["invoke.runtime_count_only"], v["invoke.runtime"], v["invoke.glibc"], v["toggle.flip"]/1000,
		v["batch20k.session_spans_per_probe"], thousands(int64(v["batch20k.probes"])), v["batch20k.session_spans_first_per_probe"], v["toggle.int3"]/1000,
		v["throughput_ratio.10k"], v["throughput_ratio.100k"]), nil
}

// ReplaceReadmeFigures returns readme with its figures block's body set to
// figures.
func ReplaceReadmeFigures(readme, figures string) (string, error) {
	i := strings.Index(readme, ReadmeBegin)
	j := strings.Index(readme, ReadmeEnd)
	if i < 0 || j < i || strings.Count(readme, ReadmeBegin) != 1 || strings.Count(readme, ReadmeEnd) != 1 {
		return "", ErrReadmeMarkers
	}
	return readme[:i+len(ReadmeBegin)] + "\n" + strings.TrimSpace(figures) + "\n" + readme[j:], nil
}

// thousands formats n with commas: 40000 -> "40,000".
func thousands(n int64) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
