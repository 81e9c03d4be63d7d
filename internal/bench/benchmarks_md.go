package bench

import (
	"fmt"
	"regexp"
	"strings"
)

// BenchmarksMD wraps a report's markdown into BENCHMARKS.md: how to
// reproduce it, the machine and conditions, then the report itself.
func BenchmarksMD(r *Report, report, conditions string) string {
	var b strings.Builder
	b.WriteString(`# Benchmarks

This file is written by the benchmark harness (internal/bench); rerun it to
refresh the figures:

    make bench          # full run, ~7 minutes on 2 cores once the targets are built (the provider row, 1c, ~4 of them) (+1-2 for the first build of the 20,000-function program), writes out/bench/results.json
    make bench-quick    # every row, smaller, under 2 minutes once the targets are built
    go run ./internal/bench/cmd/benchreport -benchmarks BENCHMARKS.md -readme README.md -conditions "..."   # refresh this file and the README's figures

Needs: root (ptrace, /proc/PID/mem, tracefs), gcc, clang-14 with its XRay
runtime (libclang-rt-14-dev), gdb, linux-perf; bpftrace is optional.
` + "`benchreport -setup`" + ` apt-get installs what is missing; a peer that still
cannot run is listed with the reason under "Not measured". The C targets are
under bench/ (each file's header gives its build command; the exact commands
of this run are at the end); results.json carries every figure with its spread
in ns and TSC ticks, and the machine description.

Figures are medians of repeated runs with p10-p90 in parentheses, in ns and
TSC ticks; every ratio or overhead is against a baseline measured in the same
run, interleaved with the variant. No test asserts any timing: ` + "`go test ./internal/bench`" + `
runs each row in a tiny configuration and checks only its counts.

`)
	m := r.Meta
	fmt.Fprintf(&b, "## Conditions of the run below\n\n- configuration: %s, %s, %.0f s\n- machine: %s; %s, %d CPUs (VM host name %s)\n- load average before/after: %s / %s\n",
		m.Config, m.Date, m.Seconds, m.Kernel, m.CPU, m.NumCPU, m.Host, m.LoadBefore, m.LoadAfter)
	if conditions != "" {
		fmt.Fprintf(&b, "- %s\n", conditions)
	}
	b.WriteString("\n")
	// The report follows, its headings one level down.
	for _, l := range strings.Split(report, "\n") {
		if strings.HasPrefix(l, "#") {
			l = "#" + l
		}
		b.WriteString(l + "\n")
	}
	b.WriteString("\n### Which provider to ship with\n\n" +
		"fentry (`-pg -mfentry` at compile time only), shipped coldpatched with the flip placeholder: " +
		"the figures of section 1c are the evidence, and docs/decisions.md (D11) carries the reasoning, " +
		"so that a regenerated report cannot lose it.\n")
	b.WriteString("\n### Build commands of this run\n\n")
	for _, c := range r.Commands {
		b.WriteString("    " + machinePath.ReplaceAllString(c, "out/bench/") + "\n")
	}
	return b.String()
}

// machinePath matches the absolute path of the output directory in a build
// command (generated sources live there): the report names it relative to
// the repository, so that it says nothing about the machine it ran on.
var machinePath = regexp.MustCompile(`/\S*/out/bench/`)
