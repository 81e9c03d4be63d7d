package report

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/shm"
)

// TestTopSampler: per-interval calls, rates and percentiles come from the
// differences between two snapshots, not from the totals.
func TestTopSampler(t *testing.T) {
	s := NewTopSampler(9, &Symbolizer{})
	t0 := time.Unix(100, 0)
	old := shm.Func{Addr: 0x10, Entries: 1000, Samples: 1000, SumNs: 1000 * 2000}
	old.Hist[10] = 1000 // 1000 calls of ~1-2 µs before the interval
	if s.Sample([]shm.Func{old, {Addr: 0x20, Entries: 5}}, t0) != nil {
		t.Fatal("first sample has no interval")
	}
	cur := old
	cur.Entries, cur.Samples, cur.SumNs = 1500, 1500, old.SumNs+500*100
	cur.Hist[6] = 490 // 500 calls during the interval, the slowest 2% in bucket 20
	cur.Hist[20] = 10
	snap := s.Sample([]shm.Func{cur, {Addr: 0x20, Entries: 5}}, t0.Add(500*time.Millisecond))
	if len(snap.Functions) != 1 {
		t.Fatalf("rows %+v: want only the function called during the interval", snap.Functions)
	}
	r := snap.Functions[0]
	_, hi6 := shm.BucketBounds(6)
	_, hi20 := shm.BucketBounds(20)
	if r.Calls != 500 || r.PerSec != 1000 || r.MeanNs != 100 || r.P50Ns != hi6 || r.P99Ns != hi20 || r.TotalCalls != 1500 || r.Name != "sub_10" {
		t.Fatalf("row %+v", r)
	}
	var buf bytes.Buffer
	if err := snap.WriteTable(&buf, 0); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "sub_10") || !strings.Contains(buf.String(), "1000") {
		t.Fatalf("table:\n%s", buf.String())
	}
}

// TestTopSamplerCountDown (D92): a count that went down between two samples
// (the runtime's only grow) is an error naming the function, not an
// interval's calls counted from zero.
func TestTopSamplerCountDown(t *testing.T) {
	s := NewTopSampler(9, &Symbolizer{})
	t0 := time.Unix(100, 0)
	old := shm.Func{Addr: 0x10, Entries: 1000, Exits: 1000, Samples: 1000, SumNs: 2000}
	if err := s.Check([]shm.Func{old}); err != nil {
		t.Fatalf("first sample: %v", err)
	}
	s.Sample([]shm.Func{old}, t0)
	cur := old
	cur.Entries = 10
	err := s.Check([]shm.Func{cur})
	if !errors.Is(err, shm.ErrOverflow) || !strings.Contains(err.Error(), "function sub_10 ") || !strings.Contains(err.Error(), "entries went down") {
		t.Fatalf("entries 1000 then 10: %v; want ErrOverflow naming sub_10, entries went down", err)
	}
	cur = old
	cur.Entries = 1500
	if err := s.Check([]shm.Func{cur}); err != nil {
		t.Fatalf("entries 1000 then 1500: %v", err)
	}
}
