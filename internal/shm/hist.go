package shm

import "math"

// BucketBounds returns the latency range [lo, hi] in ns of histogram bucket b.
func BucketBounds(b int) (lo, hi uint64) {
	if b <= 0 {
		return 0, 1
	}
	if b >= 63 {
		return 1 << 63, math.MaxUint64
	}
	return 1 << b, 1<<(b+1) - 1
}

// Percentile estimates the q-quantile (0 <= q <= 1) of the latencies counted
// in hist. The answer has bucket resolution: it is the upper bound of the
// bucket holding the ceil(q*n)-th smallest sample, clamped to [minNs, maxNs]
// when those are known (non-zero max), so the true quantile is at most the
// returned value and more than half of it (exact at the extremes). It returns
// 0 for an empty histogram.
func Percentile(hist *[HistBuckets]uint64, q float64, minNs, maxNs uint64) uint64 {
	var n uint64
	for _, c := range hist {
		n += c
	}
	if n == 0 {
		return 0
	}
	if q <= 0 || math.IsNaN(q) {
		q = 0
	}
	if q > 1 {
		q = 1
	}
	rank := uint64(math.Ceil(q * float64(n)))
	if rank == 0 {
		rank = 1
	}
	if rank > n {
		rank = n
	}
	var seen uint64
	for b, c := range hist {
		seen += c
		if seen >= rank {
			_, v := BucketBounds(b)
			if maxNs != 0 {
				if v > maxNs {
					v = maxNs
				}
				if v < minNs {
					v = minNs
				}
			}
			return v
		}
	}
	return maxNs
}
