// Package bench is edgeprobe's benchmark harness: it builds the C targets
// under bench/, runs each measurement against real processes, and writes the
// report `make bench` prints (markdown) and out/bench/results.json.
//
// The rows follow the papers the project reproduces:
//
//  1. Probe costs in the shape of Chamith et al.'s Table 2: activation and
//     deactivation of one probe from this (Go) process in a separate C target
//     with the flip, int3, int3-async and stop protocols of internal/xmod; the
//     invocation cost of an enabled probe (an empty preloaded handler, and the
//     edgeprobe runtime); and the cost of an inert site (flip and nop
//     placeholders) against the uninstrumented build and against the hooks
//     calling glibc's empty functions.
//     1c. Provider cost on real workloads: zlib 1.2.13 and libiberty (from
//     Debian's binutils-source) built uninstrumented, with
//     -finstrument-functions (cyg) and with -pg -mfentry (fentry); CPU time
//     of the inert builds (coldpatch, flip and nop) and of the active ones
//     (glibc's hooks, an empty __fentry__, the edgeprobe runtime), paired
//     against the uninstrumented build; every variant's output is checked
//     against it, and the cold ones must reach no hook.
//  2. Batch: every probe of a generated program with 20,000 instrumented
//     functions enabled and disabled; time per probe.
//  3. Throughput under toggling (their Figure 12): executor threads calling a
//     probed function while the harness toggles it at fixed rates.
//  4. The iProbe micro-benchmark (Arora et al., Figure 5): N calls of an empty
//     function with entry and exit counted, for edgeprobe and the peers that
//     run here (uprobes through tracefs, LLVM XRay, gdb breakpoints).
//  5. Attach/enable time per probe for the peers.
//  6. One `hotpatch` toggle exec to exit, with a probe list and without
//     (the scan), from the probe cache and without it, against a bare
//     `hotpatch --help`; and the time of each of its phases.
//
// Every figure is a median over repeated runs with its p10-p90 spread and
// median absolute deviation, in ns and in TSC ticks (the TSC frequency is
// calibrated at start against CLOCK_MONOTONIC), and every ratio is against a
// baseline measured in the same run. A peer that cannot run is reported with
// the reason, never dropped. The harness never asserts timings; its tests run
// each row in a tiny configuration and check the counts (a micro-benchmark
// run of N calls must count N entries and N exits).
package bench
