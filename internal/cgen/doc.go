// Package cgen writes the C source of generated test and benchmark programs
// that tests (through testutil.Generated) and internal/bench both build: a
// plain package with no dependencies, so that internal/shm's own tests and
// the benchmarks (which import internal/shm) can share one generator.
package cgen
