package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/capture"
)

// TestDropMessage: the drop report names the threads and the flag (with a
// size that would have kept the busiest thread's events), or, at the
// capacity, the variable that raises it.
func TestDropMessage(t *testing.T) {
	res := &capture.TraceResult{Dropped: 700, RingEvents: 512, RingCapacity: 65536, Duration: time.Second,
		Threads: []capture.ThreadDrops{{Tid: 11, Events: 300, Dropped: 700}, {Tid: 12, Events: 40}}}
	msg := dropMessage(res)
	for _, want := range []string{"700 events dropped", "thread 11: 700 of 1000", "rings of 512 events", "--ring-events 1024 keeps them"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "thread 12") {
		t.Errorf("%q names a thread that lost nothing", msg)
	}
	res.RingEvents = 65536
	res.Threads[0].Dropped = 200000
	if msg := dropMessage(res); !strings.Contains(msg, "EDGEPROBE_RING_MAX=131072") {
		t.Errorf("at the capacity: %q", msg)
	}
}
