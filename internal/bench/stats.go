package bench

import (
	"math"
	"sort"
	"strconv"
)

// Summary describes repeated measurements of one figure, in ns and in ticks.
type Summary struct {
	N           int     `json:"n"`
	MedianNs    float64 `json:"median_ns"`
	P10Ns       float64 `json:"p10_ns"`
	P90Ns       float64 `json:"p90_ns"`
	MADNs       float64 `json:"mad_ns"`
	MedianTicks float64 `json:"median_ticks"`
	P10Ticks    float64 `json:"p10_ticks"`
	P90Ticks    float64 `json:"p90_ticks"`
}

// Summarize computes the median, p10, p90 and median absolute deviation of
// samples given in ns.
func Summarize(samples []float64, tsc TSC) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	s := append([]float64(nil), samples...)
	sort.Float64s(s)
	med := quantile(s, 0.5)
	dev := make([]float64, len(s))
	for i, v := range s {
		dev[i] = math.Abs(v - med)
	}
	sort.Float64s(dev)
	sum := Summary{N: len(s), MedianNs: med, P10Ns: quantile(s, 0.1), P90Ns: quantile(s, 0.9), MADNs: quantile(dev, 0.5)}
	sum.MedianTicks, sum.P10Ticks, sum.P90Ticks = tsc.Ticks(sum.MedianNs), tsc.Ticks(sum.P10Ns), tsc.Ticks(sum.P90Ns)
	return sum
}

// quantile interpolates linearly between the closest ranks of sorted s.
func quantile(s []float64, q float64) float64 {
	if len(s) == 1 {
		return s[0]
	}
	pos := q * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}

// Scale returns the summary with every figure multiplied by k (k > 0).
func (s Summary) Scale(k float64) Summary {
	s.MedianNs *= k
	s.P10Ns *= k
	s.P90Ns *= k
	s.MADNs *= k
	s.MedianTicks *= k
	s.P10Ticks *= k
	s.P90Ticks *= k
	return s
}

func itoa(n int) string { return strconv.Itoa(n) }
