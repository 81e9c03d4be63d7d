// Command killtable runs the SIGKILL soak (TestKillNine with
// EDGEPROBE_LONG=1: 100 kills per protocol row) -runs times and writes its
// figures as the table of docs/protocols.md's "SIGKILL and repair" section,
// between the lines "<!-- killtable -->" and "<!-- /killtable -->", so that
// no figure there is typed by hand.
//
//	go run ./internal/hotpatch/cmd/killtable [-runs 2] [-doc docs/protocols.md]
//
// `make killtable` runs it under nice -n 19. It fails, leaving the document
// alone, when a run of the test fails.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// row is internal/hotpatch's killRow (one JSON line per protocol row).
type row struct {
	Protocol string         `json:"protocol"`
	Runtime  bool           `json:"runtime"`
	Kills    int            `json:"kills"`
	Deaths   int            `json:"deaths"`
	BySig    map[string]int `json:"by_signal"`
	Torn     int            `json:"torn"`
	Repaired int            `json:"repaired"`
	Traps    uint64         `json:"traps"`
	InProc   uint64         `json:"inproc"`
	SpanMs   float64        `json:"span_ms"`
}

const begin, end = "<!-- killtable -->", "<!-- /killtable -->"

func main() {
	runs := flag.Int("runs", 2, "soak runs")
	doc := flag.String("doc", "docs/protocols.md", "the document whose table to rewrite")
	flag.Parse()
	if *runs < 1 {
		fail(fmt.Errorf("-runs %d: need at least one", *runs))
	}
	text, err := os.ReadFile(*doc)
	if err != nil {
		fail(err)
	}
	i, j := bytes.Index(text, []byte(begin)), bytes.Index(text, []byte(end))
	if i < 0 || j < i {
		fail(fmt.Errorf("%s: no %q ... %q block", *doc, begin, end))
	}
	dir, err := os.MkdirTemp("", "killtable")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	var results [][]row
	var loads []string
	var failed []string
	started := time.Now().UTC()
	for r := 0; r < *runs; r++ {
		out := filepath.Join(dir, fmt.Sprintf("run%d.jsonl", r))
		loads = append(loads, loadavg())
		cmd := exec.Command("go", "test", "./internal/hotpatch", "-run", "^TestKillNine$", "-count=1", "-timeout", "60m", "-v")
		cmd.Env = append(os.Environ(), "EDGEPROBE_LONG=1", "EDGEPROBE_KILLNINE_OUT="+out)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		runErr := cmd.Run()
		rows, err := read(out)
		if err != nil {
			fail(fmt.Errorf("run %d: %v (go test: %v)", r+1, err, runErr))
		}
		if runErr != nil {
			// A death the test does not allow is a figure too: the table
			// shows it (its "by" column names the signal) as long as every
			// row was measured.
			if len(rows) != wantRows(results) {
				fail(fmt.Errorf("run %d: go test: %v, and only %d rows were measured", r+1, runErr, len(rows)))
			}
			failed = append(failed, fmt.Sprintf("run %d", r+1))
			fmt.Fprintf(os.Stderr, "killtable: run %d: go test failed (%v); its figures go into the table\n", r+1, runErr)
		}
		results = append(results, rows)
		loads[r] += " .. " + loadavg()
	}
	table := render(results, loads, started, failed)
	// Read again: the document may have been edited during the runs.
	if text, err = os.ReadFile(*doc); err != nil {
		fail(err)
	}
	i, j = bytes.Index(text, []byte(begin)), bytes.Index(text, []byte(end))
	if i < 0 || j < i {
		fail(fmt.Errorf("%s: the %q ... %q block is gone", *doc, begin, end))
	}
	var b bytes.Buffer
	b.Write(text[:i+len(begin)])
	b.WriteString("\n")
	b.WriteString(table)
	b.Write(text[j:])
	if err := os.WriteFile(*doc, b.Bytes(), 0o644); err != nil {
		fail(err)
	}
}

func read(path string) ([]row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rows []row
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r row
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%s: no rows", path)
	}
	return rows, sc.Err()
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return "?"
	}
	return f[0]
}

func key(r row) string { return fmt.Sprintf("%s|%v", r.Protocol, r.Runtime) }

// wantRows is the number of rows a complete run has: TestKillNine's six
// (flip, stop, int3, int3-async without the runtime; int3, int3-async with
// it), or the first run's count.
func wantRows(results [][]row) int {
	if len(results) > 0 {
		return len(results[0])
	}
	return 6
}

func render(results [][]row, loads []string, started time.Time, failed []string) string {
	var order []string
	byKey := map[string][]row{}
	for _, rows := range results {
		for _, r := range rows {
			k := key(r)
			if _, ok := byKey[k]; !ok {
				order = append(order, k)
			}
			byKey[k] = append(byKey[k], r)
		}
	}
	list := func(rs []row, f func(row) string) string {
		var s []string
		for _, r := range rs {
			s = append(s, f(r))
		}
		return strings.Join(s, ", ")
	}
	var b strings.Builder
	b.WriteString("| protocol | runtime | kills per run | target deaths (per run) | by | sites left mid-patch in survivors | repaired by `hotpatch repair` | traps the runtime's handler took | sites it repaired in-process | kills spread over (ms) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, k := range order {
		rs := byKey[k]
		rt := "no"
		if rs[0].Runtime {
			rt = "yes"
		}
		sigs := map[string]bool{}
		for _, r := range rs {
			for s := range r.BySig {
				sigs[s] = true
			}
		}
		var by []string
		for s := range sigs {
			by = append(by, s)
		}
		sort.Strings(by)
		bys := "-"
		if len(by) > 0 {
			bys = strings.Join(by, ", ") + " only"
		}
		all := "all"
		for _, r := range rs {
			if r.Repaired != r.Torn {
				all = list(rs, func(r row) string { return fmt.Sprint(r.Repaired) })
			}
		}
		traps, inproc := "-", "-"
		if rs[0].Runtime {
			traps = list(rs, func(r row) string { return fmt.Sprint(r.Traps) })
			inproc = list(rs, func(r row) string { return fmt.Sprint(r.InProc) })
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", rs[0].Protocol, rt, rs[0].Kills,
			list(rs, func(r row) string { return fmt.Sprint(r.Deaths) }), bys,
			list(rs, func(r row) string { return fmt.Sprint(r.Torn) }), all, traps, inproc,
			list(rs, func(r row) string { return fmt.Sprintf("%.0f", r.SpanMs) }))
	}
	if len(failed) > 0 {
		fmt.Fprintf(&b, "\nThe test failed in %s: a death it does not allow (see the \"by\" column).\n", strings.Join(failed, ", "))
	}
	fmt.Fprintf(&b, "\nGenerated by `make killtable` (%d runs of `EDGEPROBE_LONG=1 go test ./internal/hotpatch -run TestKillNine`, started %s UTC; 1-minute load average at the start and end of each run: %s).\n",
		len(results), started.Format("2006-01-02 15:04"), strings.Join(loads, "; "))
	return b.String()
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "killtable: %v\n", err)
	os.Exit(1)
}
