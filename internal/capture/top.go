package capture

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/report"
	"github.com/edgeprobe/edgeprobe/internal/shm"
)

// Top samples the process's function table every interval and passes each
// interval's snapshot to show, count times (0: until ctx ends or the
// process exits). With selectors it turns those probes on for the duration
// and puts them back at the end (holding the process's hotpatch lock
// meanwhile); without, it only reads, and changes nothing in the process.
func Top(ctx context.Context, o Options, interval time.Duration, count int, show func(*report.TopSnapshot) error) (err error) {
	var (
		region *shm.Region
		sym    *report.Symbolizer
		watch  = func() {} // a session's seccomp look (D56); none when only reading
	)
	if len(o.Selectors) > 0 {
		s, err := open(ctx, o)
		if err != nil {
			return err
		}
		defer func() {
			if cerr := s.close(ctx); err == nil {
				err = cerr
			}
		}()
		region, sym = s.region, s.sym
		watch = s.watchSeccomp
	} else {
		region, err = shm.OpenPID(procfs.Via(o.PID)) // the main thread may have exited (D95)
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("pid %d: %w (start it with LD_PRELOAD=libedgeprobe.so)", o.PID, ErrNoRuntime)
		}
		if err != nil {
			return err
		}
		defer region.Close()
		var lists []*probelist.List
		for _, f := range o.ProbeFiles {
			l, err := probelist.ReadFile(f)
			if err != nil {
				return err
			}
			lists = append(lists, l)
		}
		if sym, err = report.ForPID(procfs.Via(o.PID), lists); err != nil {
			return err
		}
	}
	// The process watched is this pid with this start time and this image:
	// a zombie (killed, not yet reaped by its parent) keeps its /proc entry,
	// a reused pid names another process.
	st0, err := procfs.ReadStat(o.PID, 0)
	if err != nil {
		return err
	}
	// A process that ran exec is another program: the probes and counters
	// watched went with its old image.
	maps, _ := os.Open(fmt.Sprintf("/proc/%d/maps", procfs.Via(o.PID)))
	if maps != nil {
		defer maps.Close()
	}
	alive := func() bool {
		return running(o.PID, st0.StartTime) && !ranExec(maps, o.PID)
	}
	sampler := report.NewTopSampler(o.PID, sym)
	// Counts that wrap are an error naming the function (D92), never a rate.
	functions := func() ([]shm.Func, error) {
		fs := region.Functions()
		err := report.CheckSums(fs, sym)
		if err == nil {
			err = sampler.Check(fs)
		}
		if err != nil {
			return nil, fmt.Errorf("pid %d: %w", o.PID, err)
		}
		return fs, nil
	}
	fs, err := functions()
	if err != nil {
		return err
	}
	sampler.Sample(fs, time.Now())
	// A timer armed after each sample, not a ticker: when sampling or
	// printing overruns an interval (a loaded machine), a ticker's pending
	// tick would make the next snapshot cover a fraction of a millisecond.
	t := time.NewTimer(interval)
	defer t.Stop()
	for n := 0; count == 0 || n < count; n++ {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		watch()
		fs, err := functions()
		if err != nil {
			return err
		}
		snap := sampler.Sample(fs, time.Now())
		t.Reset(interval)
		snap.Exited = region.Exited() || !alive()
		if err := show(snap); err != nil {
			return err
		}
		if snap.Exited {
			return nil
		}
	}
	return nil
}
