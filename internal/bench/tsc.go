package bench

import (
	"os"
	"runtime"
	"sort"
	"strings"
	"time"
)

// rdtsc reads the time-stamp counter (tsc_amd64.s).
func rdtsc() uint64

// TSC is the time-stamp counter's rate, as calibrated.
type TSC struct {
	Hz        float64 // ticks per second
	Invariant bool    // cpuinfo reports constant_tsc and nonstop_tsc
	Method    string
}

// Ticks converts ns to TSC ticks.
func (t TSC) Ticks(ns float64) float64 { return ns * t.Hz / 1e9 }

// CalibrateTSC measures the TSC rate against CLOCK_MONOTONIC (Go's monotonic
// clock) over rounds windows of d each, and returns the median rate.
func CalibrateTSC(rounds int, d time.Duration) TSC {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	rates := make([]float64, 0, rounds)
	for i := 0; i < rounds; i++ {
		t0, k0 := time.Now(), rdtsc()
		for time.Since(t0) < d {
		}
		k1, el := rdtsc(), time.Since(t0)
		rates = append(rates, float64(k1-k0)/el.Seconds())
	}
	sort.Float64s(rates)
	info, _ := os.ReadFile("/proc/cpuinfo")
	flags := string(info)
	return TSC{
		Hz:        rates[len(rates)/2],
		Invariant: strings.Contains(flags, " constant_tsc") && strings.Contains(flags, " nonstop_tsc"),
		Method:    "rdtsc against CLOCK_MONOTONIC, median of " + itoa(rounds) + " windows of " + d.String(),
	}
}
