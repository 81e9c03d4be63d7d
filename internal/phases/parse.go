package phases

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Line is one line of Print's table, read back: times in ns.
type Line struct {
	Name string
	// Wall, CPU, Vcsw and Minflt are the phase's (the first line: CPU,
	// switches and faults since the process started, Wall 0).
	Wall, CPU, Vcsw, Minflt int64
	// Mono is the CLOCK_MONOTONIC time of the mark, on the first and the
	// last ("total") lines only, else 0.
	Mono int64
}

// ErrNoTable: the text holds no phase table Print could have written.
var ErrNoTable = errors.New("no phase table")

// Parse reads Print's lines out of text (other lines are skipped): the
// first mark's, one per phase, and the total's, last.
func Parse(text []byte) ([]Line, error) {
	var out []Line
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 || f[0] != "phase" {
			continue
		}
		l := Line{Name: f[1]}
		for _, kv := range f[2:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				continue
			}
			us := strings.HasSuffix(v, "us")
			n, err := strconv.ParseInt(strings.TrimSuffix(v, "us"), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("phase line %q: %v", sc.Text(), err)
			}
			if us {
				if n > math.MaxInt64/1000 || n < math.MinInt64/1000 {
					return nil, fmt.Errorf("phase line %q: %s=%s does not fit in ns", sc.Text(), k, v)
				}
				n *= 1000 // FuzzParse: it wrapped to a negative time
			}
			switch k {
			case "wall":
				l.Wall = n
			case "cpu":
				l.CPU = n
			case "vcsw":
				l.Vcsw = n
			case "minflt":
				l.Minflt = n
			case "mono":
				l.Mono = n
			}
		}
		out = append(out, l)
	}
	if len(out) < 2 || out[len(out)-1].Name != "total" || out[len(out)-1].Mono == 0 || out[0].Mono == 0 {
		return nil, ErrNoTable
	}
	return out, nil
}
