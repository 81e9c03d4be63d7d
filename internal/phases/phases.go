package phases

import (
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Env turns the timer on ("1": print at exit to stderr).
const Env = "EDGEPROBE_PHASES"

// on is read once: Mark must cost nothing when the timer is off.
var on = os.Getenv(Env) != ""

// On reports whether the timer runs.
func On() bool { return on }

type mark struct {
	name                string
	mono                int64 // CLOCK_MONOTONIC, ns
	cpu                 int64 // user+sys of the process, ns
	vcsw, ivcsw, minflt int64
}

// maxMarks bounds what a long-lived command (a session, a capture, which
// pass the marks of every toggle) keeps: the first marks are the ones the
// timer is for.
const maxMarks = 256

var (
	mu    sync.Mutex
	marks []mark
)

// Mark ends the phase called name: the time since the previous mark (the
// first mark's line has the totals since the process started).
func Mark(name string) {
	if !on {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	if len(marks) >= maxMarks {
		return
	}
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	marks = append(marks, mark{name: name, mono: ts.Nano(),
		cpu:  ru.Utime.Nano() + ru.Stime.Nano(),
		vcsw: ru.Nvcsw, ivcsw: ru.Nivcsw, minflt: ru.Minflt})
}

// Print writes one line per phase: its name, wall time, CPU time,
// voluntary and involuntary context switches and minor page faults, all
// since the previous mark; the first mark's line has the totals since the
// process started (CPU, switches, faults) and its CLOCK_MONOTONIC time, so
// that a caller that noted the clock before exec can compute the start-up.
// Every line starts with "phase ", for scripts.
func Print(w io.Writer) {
	if !on {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	if len(marks) == 0 {
		return
	}
	m0 := marks[0]
	fmt.Fprintf(w, "phase %-10s mono=%d cpu=%dus vcsw=%d ivcsw=%d minflt=%d\n", m0.name, m0.mono, m0.cpu/1000, m0.vcsw, m0.ivcsw, m0.minflt)
	for i := 1; i < len(marks); i++ {
		a, b := marks[i-1], marks[i]
		fmt.Fprintf(w, "phase %-10s wall=%dus cpu=%dus vcsw=%d ivcsw=%d minflt=%d\n", b.name,
			(b.mono-a.mono)/1000, (b.cpu-a.cpu)/1000, b.vcsw-a.vcsw, b.ivcsw-a.ivcsw, b.minflt-a.minflt)
	}
	last := marks[len(marks)-1]
	fmt.Fprintf(w, "phase %-10s wall=%dus cpu=%dus vcsw=%d ivcsw=%d minflt=%d mono=%d\n", "total",
		(last.mono-m0.mono)/1000, last.cpu/1000, last.vcsw, last.ivcsw, last.minflt, last.mono)
}
