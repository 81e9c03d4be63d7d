package capture

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/hotpatch"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/report"
	"github.com/edgeprobe/edgeprobe/internal/shm"
)

// ErrNoRuntime means the process does not run the edgeprobe runtime, so
// nothing records what enabled probes report.
var ErrNoRuntime = errors.New("no edgeprobe runtime in the process")

// Options select what to capture.
type Options struct {
	PID        int
	ProbeFiles []string
	Selectors  []probelist.Selector // probes to enable for the capture; none: use what is on
	Duration   time.Duration
	// MaxCalls ends a trace early once it holds this many calls (0: no
	// limit): a hot function makes millions of events a second, and the
	// capture is held in memory.
	MaxCalls int
	// Filters enforced by the runtime while a trace runs (D32): only calls
	// at probed-call depth below MaxDepth (0: any), only the threads in Tids
	// (none: every thread), and at most Rate calls per function per second
	// (0: no limit; counted calls too are limited while it runs).
	MaxDepth    int
	Tids        []int
	Rate        uint64
	MinDuration time.Duration // only calls that lasted at least this (their enters are written at their exit)
	// Args and Retval (trace only): globs over the names of fentry functions
	// whose arguments / return values the trace records (among those
	// Selectors enable; without Selectors, whichever are on).
	Args, Retval []string
	// RingEvents (trace only): the size of every thread's event ring for
	// the capture, a power of two (0: the process's default); rings take it
	// when the capture starts and go back to the default after.
	RingEvents uint32
	// Progress, if set, is called about ten times a second.
	Progress func(elapsed time.Duration, detail string)
}

// session is what both captures open: the region, the hotpatch session and
// the probes they turned on.
type session struct {
	region  *shm.Region
	hp      *hotpatch.Session
	sym     *report.Symbolizer
	enabled *hotpatch.Result
	quota   bool // the capture turned the runtime's quotas on: off again at close
	filter  bool // the capture turned the runtime's trace filters on: off again at close
	pid     int
	// when watchSeccomp last read the threads' seccomp state
	seccompAt time.Time
	start     uint64 // the process's start time (/proc/PID/stat): a reused pid is another process
	// maps is /proc/PID/maps opened at the start: bound to the address
	// space of that time, it reads nothing once the process ran exec.
	maps *os.File
}

// execed reports whether the process ran exec since the capture began: its
// old address space, which held the probes and the rings, is gone while
// the process has one.
func (s *session) execed() bool { return ranExec(s.maps, s.pid) }

// ranExec reports whether pid ran exec since maps, its /proc/PID/maps, was
// opened: that file stays bound to the address space of then and reads
// nothing once the process has another (nil: not watched).
func ranExec(maps *os.File, pid int) bool {
	if maps == nil {
		return false
	}
	var b [1]byte
	n, _ := maps.ReadAt(b[:], 0)
	return n == 0 && procfs.HasMemory(procfs.Via(pid))
}

// running reports whether pid is still the process that had start time
// start and still has its memory. A process whose main thread has exited
// runs on in its other threads (its main thread a zombie, D95): its memory
// is looked at through one of them.
func running(pid int, start uint64) bool {
	st, err := procfs.ReadStat(pid, 0)
	if err != nil || st.StartTime != start {
		return false
	}
	if st.State == 'Z' || st.State == 'X' {
		return procfs.LeaderExited(pid) && procfs.HasMemory(procfs.Via(pid))
	}
	return procfs.HasMemory(pid) // exiting: its memory is gone before it is a zombie
}

// endedAs says how the process ended for the capture ("ended", "ran
// exec"), "" while it goes on.
func (s *session) endedAs() string {
	switch {
	case s.region.Exited() || s.gone():
		return "ended"
	case s.execed():
		return "ran exec"
	}
	return ""
}

// gone reports whether the captured process has ended (exiting, exited,
// killed, a zombie not yet reaped, or its pid reused): nothing more can happen in it,
// and nothing is left in it to restore.
func (s *session) gone() bool { return !running(s.pid, s.start) }

func open(ctx context.Context, o Options) (*session, error) {
	// Through a live thread when the main thread has exited (D95): its
	// own /proc entry reaches no descriptor or map. The lock is taken by
	// the pid (hotpatch.Open).
	via := procfs.Via(o.PID)
	region, err := shm.OpenPID(via)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("pid %d: %w (start it with LD_PRELOAD=libedgeprobe.so)", o.PID, ErrNoRuntime)
	}
	if err != nil {
		return nil, err
	}
	s := &session{region: region, pid: o.PID}
	if s.hp, err = hotpatch.Open(o.PID, o.ProbeFiles, false); err != nil {
		region.Close()
		return nil, err
	}
	if st, err := procfs.ReadStat(o.PID, 0); err == nil {
		s.start = st.StartTime
	}
	s.maps, _ = os.Open(fmt.Sprintf("/proc/%d/maps", via)) // nil: exec is not watched
	if err := s.resetStale(); err != nil {
		s.close(ctx)
		return nil, err
	}
	s.watchSeccomp()
	var lists []*probelist.List
	for _, t := range s.hp.Targets() {
		l, err := t.List.List()
		if err != nil {
			s.close(ctx)
			return nil, err
		}
		lists = append(lists, l)
	}
	if s.sym, err = report.ForPID(via, lists); err != nil {
		s.close(ctx)
		return nil, err
	}
	if err := s.enable(ctx, o.Selectors); err != nil {
		s.close(ctx)
		return nil, err
	}
	return s, nil
}

// StaleBits are the control bits only a running capture sets (trace
// events, argument records, quotas, trace filters). With no capture running
// they are left over from one that was killed before its close (SIGKILL).
const StaleBits = shm.CtlTrace | shm.CtlArgs | shm.CtlQuota | shm.CtlFilter

// resetStale turns off what a capture killed before its close left on
// (StaleBits, the quota, the filters, the argument plans), so that each
// capture starts from the runtime's defaults and sets only what it asks
// for. It is safe because the caller holds the process's hotpatch lock
// (hotpatch.Open): no other capture is running whose bits these could be.
// The ring size a killed trace asked for is Trace's to reset: the rings
// must be drained first (and nothing writes to them with CtlTrace off).
func (s *session) resetStale() error {
	if !s.region.Writable() {
		return nil // read-only to us: the capture says so when it needs to write
	}
	if s.region.Control()&StaleBits != 0 {
		if err := s.region.SetControl(0, StaleBits); err != nil {
			return err
		}
	}
	// with the bits off, the values they guard are unused: clear them too
	if err := s.region.SetQuota(0); err != nil {
		return err
	}
	if err := s.region.ClearQuotaTrace(); err != nil {
		return err
	}
	if err := s.region.SetFilter(0, nil, 0); err != nil {
		return err
	}
	s.region.ClearArgPlans()
	return nil
}

// watchSeccomp tells the runtime, once a thread of the process is seen
// under seccomp, to make no more system calls in its hooks (D56): the
// preloaded runtime's interposers see prctl and syscall(SYS_seccomp), but
// not a filter installed with a raw syscall instruction, nor one installed
// before or after a runtime loaded with dlopen. Called at the capture's
// start and from its loops, at most once a second (each look reads every
// thread's status); nothing once the flag is set. A read-only region is
// left alone.
func (s *session) watchSeccomp() {
	if !s.region.Writable() || s.region.Nosys() || !s.seccompAt.IsZero() && time.Since(s.seccompAt) < time.Second {
		return
	}
	s.seccompAt = time.Now()
	if procfs.SeccompThreads(s.pid) > 0 {
		s.region.SetNosys()
	}
}

// enable turns on the probes sels select; close restores them.
func (s *session) enable(ctx context.Context, sels []probelist.Selector) error {
	if len(sels) == 0 {
		return nil
	}
	actions := make([]hotpatch.Action, len(sels))
	for i, sel := range sels {
		actions[i] = hotpatch.Action{Enable: true, Selector: sel}
	}
	var err error
	s.enabled, err = s.hp.Apply(ctx, actions, hotpatch.ProtoAuto, 0)
	return err
}

// close restores the probes it enabled, detaches and unmaps. Restoring must
// happen even after SIGINT, so it runs on a fresh context.
func (s *session) close(context.Context) error {
	var err error
	if s.enabled != nil {
		err = s.hp.Restore(context.Background(), s.enabled)
	}
	if s.quota {
		// after the restore: calls made until then stay within their quota
		if qerr := s.region.SetControl(0, shm.CtlQuota); err == nil {
			err = qerr
		}
	}
	if s.filter {
		if ferr := s.region.SetControl(0, shm.CtlFilter); err == nil {
			err = ferr
		}
		if ferr := s.region.SetFilter(0, nil, 0); err == nil {
			err = ferr
		}
	}
	if cerr := s.hp.Close(); err == nil {
		err = cerr
	}
	s.region.Close()
	if s.maps != nil {
		s.maps.Close()
	}
	if err != nil && (hotpatch.Gone(err) || onlyUnmapped(err)) {
		// The process ended during the capture, or ran exec (its memory
		// is gone, not the process), or unloaded an object the capture
		// had probes on: their probes went with the image, and what it
		// recorded until then is the capture's to keep.
		err = nil
	}
	return err
}

// onlyUnmapped reports whether err is a Restore's that failed only for
// objects no longer mapped (hotpatch.ErrUnmapped): every other probe was
// put back.
func onlyUnmapped(err error) bool {
	if !errors.Is(err, hotpatch.ErrUnmapped) {
		return false
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !errors.Is(e, hotpatch.ErrUnmapped) {
				return false
			}
		}
	}
	return true
}

// ticker calls fn every period until d has passed or ctx ends, then once more.
func ticker(ctx context.Context, d, period time.Duration, progress func(time.Duration, string), fn func(elapsed time.Duration) string) {
	start := time.Now()
	t := time.NewTicker(period)
	defer t.Stop()
	// The end comes when it is due, not at the next tick: a period longer
	// than d (a profile's epoch/20 with --epoch 1h) would overrun it.
	end := time.NewTimer(d)
	defer end.Stop()
	lastReport := time.Time{}
	for {
		elapsed := time.Since(start)
		detail := fn(elapsed)
		if progress != nil && time.Since(lastReport) >= 100*time.Millisecond {
			progress(elapsed, detail)
			lastReport = time.Now()
		}
		if elapsed >= d || ctx.Err() != nil {
			return
		}
		select {
		case <-ctx.Done():
		case <-t.C:
		case <-end.C:
		}
	}
}
