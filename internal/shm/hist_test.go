package shm

import "testing"

func TestBucketBounds(t *testing.T) {
	for b := 0; b < HistBuckets; b++ {
		lo, hi := BucketBounds(b)
		if lo > hi {
			t.Fatalf("bucket %d: [%d, %d]", b, lo, hi)
		}
		if b > 0 {
			_, prevHi := BucketBounds(b - 1)
			if lo != prevHi+1 {
				t.Fatalf("bucket %d starts at %d, previous ends at %d", b, lo, prevHi)
			}
		}
	}
	if lo, hi := BucketBounds(10); lo != 1024 || hi != 2047 {
		t.Errorf("bucket 10 = [%d, %d]", lo, hi)
	}
}

func TestPercentile(t *testing.T) {
	var h [HistBuckets]uint64
	if Percentile(&h, 0.5, 0, 0) != 0 {
		t.Error("empty histogram")
	}
	// 90 samples in [64,127], 9 in [1024,2047], 1 in [65536,131071]
	h[6], h[10], h[16] = 90, 9, 1
	for _, tc := range []struct {
		q        float64
		min, max uint64
		want     uint64
	}{
		{0.5, 0, 0, 127},
		{0.9, 0, 0, 127},
		{0.91, 0, 0, 2047},
		{0.99, 0, 0, 2047},
		{1, 0, 0, 131071},
		{1, 70, 100000, 100000}, // clamped to max
		{0, 100, 100000, 127},
		{0.5, 100, 100000, 127},
		{0.01, 127, 100000, 127},
		{-1, 0, 0, 127},
		{2, 0, 0, 131071},
	} {
		if got := Percentile(&h, tc.q, tc.min, tc.max); got != tc.want {
			t.Errorf("q=%v min=%d max=%d: %d, want %d", tc.q, tc.min, tc.max, got, tc.want)
		}
	}
}

// TestPercentileFromSamples feeds known samples through the runtime's bucket
// rule and checks the estimate bounds the exact quantile within a factor 2.
func TestPercentileFromSamples(t *testing.T) {
	var h [HistBuckets]uint64
	var samples []uint64
	for i := uint64(1); i <= 1000; i++ {
		v := i * i
		samples = append(samples, v)
		b := 63 - leadingZeros(v|1)
		h[b]++
	}
	for _, q := range []float64{0.5, 0.9, 0.99} {
		exact := samples[int(q*1000)-1]
		est := Percentile(&h, q, 1, 1000000)
		if est < exact || est/2 >= exact {
			t.Errorf("q=%v: estimate %d, exact %d", q, est, exact)
		}
	}
}

func leadingZeros(v uint64) int {
	n := 0
	for i := 63; i >= 0 && v&(1<<uint(i)) == 0; i-- {
		n++
	}
	return n
}
