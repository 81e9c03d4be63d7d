// Command benchreport runs edgeprobe's benchmarks (internal/bench) and prints
// the markdown report; it writes out/bench/results.json and results.md.
//
//	go run ./internal/bench/cmd/benchreport [-quick] [-rows toggle,micro] [-setup] [-benchmarks BENCHMARKS.md -readme README.md]
//
// `make bench` runs it as is (about 7 minutes on two cores once the targets are built, 4 of them the provider row), `make
// bench-quick` with -quick (under 2 minutes once the targets are built).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/bench"
)

func main() {
	quick := flag.Bool("quick", false, "the quick configuration (bench-quick)")
	tiny := flag.Bool("tiny", false, "the tests' tiny configuration (counts only; the timings mean nothing)")
	out := flag.String("out", "", "output directory (default <repo>/out/bench)")
	rows := flag.String("rows", "", "comma-separated rows to run: "+strings.Join(bench.Rows, ","))
	wait := flag.Duration("int3-wait", 0, "int3 wait between phases (0: xmod.DefaultWait)")
	setup := flag.Bool("setup", false, "apt-get install the missing peers (bpftrace, linux-perf, gdb, libclang-rt-14-dev) and binutils-source (the provider row's workloads) first")
	quiet := flag.Bool("q", false, "no progress lines on stderr")
	benchmd := flag.String("benchmarks", "", "also write this file (BENCHMARKS.md) with the report and how to reproduce it")
	conditions := flag.String("conditions", "", "a sentence on the run's conditions for -benchmarks (e.g. \"quiet machine\")")
	readme := flag.String("readme", "", "also rewrite this file's (README.md) figures block from the run (a full run of the invoke, toggle, batch and throughput rows)")
	flag.Parse()

	root, err := bench.FindRoot(".")
	if err != nil {
		fail(err)
	}
	if *out == "" {
		*out = filepath.Join(root, "out", "bench")
	}
	cfg := bench.Full()
	if *quick {
		cfg = bench.Quick()
	}
	if *tiny {
		cfg = bench.Tiny()
	}
	cfg.Int3Wait = *wait
	if *rows != "" {
		cfg.Rows = map[string]bool{}
		for _, r := range strings.Split(*rows, ",") {
			cfg.Rows[strings.TrimSpace(r)] = true
		}
	}
	if !*quiet {
		cfg.Log = os.Stderr
	}
	if *setup {
		installPeers()
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	h, err := bench.New(root, *out, cfg)
	if err != nil {
		fail(err)
	}
	h.Run(ctx)
	h.Rep.Meta.LoadAfter = bench.Loadavg()
	js, err := h.Rep.JSON()
	if err != nil {
		fail(err)
	}
	md := h.Rep.Markdown()
	if err := os.WriteFile(filepath.Join(*out, "results.json"), js, 0o644); err != nil {
		fail(err)
	}
	if err := os.WriteFile(filepath.Join(*out, "results.md"), []byte(md), 0o644); err != nil {
		fail(err)
	}
	if *benchmd != "" {
		if err := os.WriteFile(*benchmd, []byte(bench.BenchmarksMD(h.Rep, md, *conditions)), 0o644); err != nil {
			fail(err)
		}
	}
	if *readme != "" {
		if err := writeReadme(*readme, h.Rep); err != nil {
			fail(err)
		}
	}
	fmt.Print(md)
	fmt.Fprintf(os.Stderr, "wrote %s and results.md\n", filepath.Join(*out, "results.json"))
}

// writeReadme rewrites path's figures block from r (nothing is written when
// a figure is missing).
func writeReadme(path string, r *bench.Report) error {
	fig, err := bench.ReadmeFigures(r)
	if err != nil {
		return err
	}
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s, err := bench.ReplaceReadmeFigures(string(old), fig)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, []byte(s), 0o644)
}

// installPeers installs what the peers need from Debian, when missing.
func installPeers() {
	var pkgs []string
	for bin, pkg := range map[string]string{"bpftrace": "bpftrace", "perf": "linux-perf", "gdb": "gdb"} {
		if _, err := exec.LookPath(bin); err != nil {
			pkgs = append(pkgs, pkg)
		}
	}
	if m, _ := filepath.Glob("/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.xray-x86_64.a"); len(m) == 0 {
		pkgs = append(pkgs, "libclang-rt-14-dev")
	}
	if _, err := os.Stat(bench.BinutilsTarball); err != nil {
		pkgs = append(pkgs, "binutils-source") // zlib and libiberty for the provider row
	}
	if len(pkgs) == 0 {
		return
	}
	fmt.Fprintf(os.Stderr, "bench: installing %s\n", strings.Join(pkgs, " "))
	run := func(args ...string) {
		c := exec.Command("apt-get", args...)
		c.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		c.Stdout, c.Stderr = os.Stderr, os.Stderr
		if err := c.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: apt-get %s: %v (the peers that need it are reported as not run)\n", strings.Join(args, " "), err)
		}
	}
	start := time.Now()
	run("update", "-qq")
	run(append([]string{"install", "-y", "-qq", "--no-install-recommends"}, pkgs...)...)
	fmt.Fprintf(os.Stderr, "bench: set-up took %v\n", time.Since(start).Round(time.Second))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "benchreport:", err)
	os.Exit(1)
}
