package testjson

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Event is one line of `go test -json` (see `go doc test2json`). Build
// output of a package that does not compile comes as ImportPath events.
type Event struct {
	Time        time.Time
	Action      string
	Package     string
	Test        string
	Elapsed     float64 // seconds
	Output      string
	ImportPath  string
	FailedBuild string
}

// Counts are the closing line's numbers.
type Counts struct{ Passed, Failed, Skipped int }

// String is the closing line, e.g. "471 passed, 0 failed, 2 skipped".
func (c Counts) String() string {
	return fmt.Sprintf("%d passed, %d failed, %d skipped", c.Passed, c.Failed, c.Skipped)
}

// Timing is how long a package or a top-level test took.
type Timing struct {
	Name    string
	Seconds float64
}

// Tally reads events, writes what a person needs to read as they come (each
// package's result, the whole output of every failed test, one line per
// skipped test with its reason, build errors) and counts.
//
// What counts: every test and every subtest that ends (pass, fail, skip) is
// one, so a failing subtest and its failing parent are two failures. A test
// that started but never ended (its binary crashed, or timed out) is a
// failure. A package that fails with no failed test of its own (it did not
// build, TestMain failed, it crashed between tests) is one failure too, so
// no broken package can hide behind "0 failed". A package without test
// files counts as nothing.
type Tally struct {
	w        io.Writer
	counts   Counts
	pkgs     map[string]*pkgState
	builds   map[string][]string // ImportPath -> build output
	packages []Timing
	tests    []Timing
	badLines int
}

type pkgState struct {
	outputs map[string][]string // test -> its output so far
	running map[string]bool     // tests that started and have not ended
	failed  int                 // failed tests so far
	out     []string            // package-level output
}

// NewTally returns a Tally writing the readable log to w.
func NewTally(w io.Writer) *Tally {
	return &Tally{w: w, pkgs: map[string]*pkgState{}, builds: map[string][]string{}}
}

// Counts returns the counts so far.
func (t *Tally) Counts() Counts { return t.counts }

// MalformedLines is how many input lines were not events (go test's own
// errors, or a test binary writing to stdout outside any test).
func (t *Tally) MalformedLines() int { return t.badLines }

// Read consumes r to its end, line by line, copying each line to raw when
// raw is not nil (to keep the JSON for later analysis).
func (t *Tally) Read(r io.Reader, raw io.Writer) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if raw != nil {
			if _, err := raw.Write(append(line, '\n')); err != nil {
				return err
			}
		}
		var e Event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			// Not an event: show it, and let the caller decide (a run
			// that printed such lines is not a clean one).
			t.badLines++
			fmt.Fprintf(t.w, "%s\n", line)
			continue
		}
		t.Add(e)
	}
	return sc.Err()
}

// Add takes one event.
func (t *Tally) Add(e Event) {
	if e.ImportPath != "" && e.Package == "" {
		if e.Action == "build-output" {
			t.builds[e.ImportPath] = append(t.builds[e.ImportPath], e.Output)
		}
		return
	}
	p := t.pkgs[e.Package]
	if p == nil {
		p = &pkgState{outputs: map[string][]string{}, running: map[string]bool{}}
		t.pkgs[e.Package] = p
	}
	if e.Test == "" {
		t.addPackage(p, e)
		return
	}
	switch e.Action {
	case "run":
		p.running[e.Test] = true
	case "output":
		p.outputs[e.Test] = append(p.outputs[e.Test], e.Output)
	case "pass":
		t.counts.Passed++
		t.endTest(p, e)
	case "skip":
		t.counts.Skipped++
		fmt.Fprintf(t.w, "SKIP %s %s: %s\n", e.Package, e.Test, skipReason(p.outputs[e.Test]))
		t.endTest(p, e)
	case "fail":
		t.counts.Failed++
		p.failed++
		fmt.Fprint(t.w, strings.Join(p.outputs[e.Test], ""))
		t.endTest(p, e)
	}
}

func (t *Tally) endTest(p *pkgState, e Event) {
	if !strings.Contains(e.Test, "/") {
		t.tests = append(t.tests, Timing{e.Package + " " + e.Test, e.Elapsed})
	}
	delete(p.running, e.Test)
	delete(p.outputs, e.Test)
}

func (t *Tally) addPackage(p *pkgState, e Event) {
	switch e.Action {
	case "output":
		p.out = append(p.out, e.Output)
	case "pass":
		fmt.Fprintf(t.w, "ok   %s %.1fs\n", e.Package, e.Elapsed)
		t.packages = append(t.packages, Timing{e.Package, e.Elapsed})
	case "skip": // no test files
	case "fail":
		// Tests that started and never ended: the binary died under them
		// (a crash, os.Exit, the -timeout panic). Their output says why.
		var dangling []string
		for name := range p.running {
			dangling = append(dangling, name)
		}
		sort.Strings(dangling)
		for _, name := range dangling {
			t.counts.Failed++
			p.failed++
			fmt.Fprint(t.w, strings.Join(p.outputs[name], ""))
			fmt.Fprintf(t.w, "--- FAIL: %s (never finished)\n", name)
		}
		if e.FailedBuild != "" {
			fmt.Fprint(t.w, strings.Join(t.builds[e.FailedBuild], ""))
		}
		fmt.Fprint(t.w, strings.Join(p.out, ""))
		if p.failed == 0 {
			t.counts.Failed++ // the package itself: see Tally
		}
		t.packages = append(t.packages, Timing{e.Package, e.Elapsed})
	}
}

// skipReason is the first line a skipped test logged (t.Skip's message),
// without its file:line prefix.
func skipReason(out []string) string {
	for _, l := range out {
		s := strings.TrimSpace(l)
		if s == "" || strings.HasPrefix(s, "=== ") || strings.HasPrefix(s, "--- ") {
			continue
		}
		if i := strings.Index(s, ": "); i > 0 && strings.Contains(s[:i], ".go:") {
			s = s[i+2:]
		}
		return s
	}
	return "(no reason given)"
}

// Slowest returns the n slowest packages and the n slowest top-level tests.
func (t *Tally) Slowest(n int) (packages, tests []Timing) {
	return top(t.packages, n), top(t.tests, n)
}

func top(ts []Timing, n int) []Timing {
	s := append([]Timing(nil), ts...)
	sort.SliceStable(s, func(i, j int) bool { return s[i].Seconds > s[j].Seconds })
	if len(s) > n {
		s = s[:n]
	}
	return s
}
