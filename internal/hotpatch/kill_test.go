package hotpatch

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
	"golang.org/x/sys/unix"
)

// killTrials is the number of SIGKILLs per protocol: 100 with
// EDGEPROBE_LONG (make test-long; the figure docs/protocols.md quotes),
// 12 otherwise.
func killTrials() int {
	if testutil.Long() {
		return 100
	}
	return 12
}

// progressOrDeath polls the target's progress counter until it has grown by
// n (alive) or the process is gone; it does not read through a dead
// process's memory.
func progressOrDeath(t *testing.T, s *subject, n uint64) bool {
	t.Helper()
	read := func() (uint64, bool) {
		f, err := os.Open(fmt.Sprintf("/proc/%d/mem", s.Pid))
		if err != nil {
			return 0, false
		}
		defer f.Close()
		var b [8]byte
		if _, err := f.ReadAt(b[:], int64(s.progress)); err != nil {
			return 0, false
		}
		return binary.LittleEndian.Uint64(b[:]), true
	}
	start, ok := read()
	deadline := time.Now().Add(time.Minute)
	for ok && s.Alive() {
		cur, ok2 := read()
		if !ok2 {
			break
		}
		if cur-start >= n {
			return true
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d neither progressed by %d nor died in a minute", s.Pid, n)
		}
	}
	return false
}

// EnvKillNineOut names a file TestKillNine appends one JSON line per
// protocol row to (killRow): the figures of docs/protocols.md's "SIGKILL
// and repair" table, which `make killtable` (internal/hotpatch/cmd/killtable)
// regenerates from them.
const EnvKillNineOut = "EDGEPROBE_KILLNINE_OUT"

// killRow is one row of TestKillNine's figures.
type killRow struct {
	Protocol string         `json:"protocol"`
	Runtime  bool           `json:"runtime"` // the target runs the runtime (its SIGTRAP handler, D89)
	Kills    int            `json:"kills"`
	Deaths   int            `json:"deaths"`
	BySig    map[string]int `json:"by_signal"`
	Torn     int            `json:"torn"`     // sites seen mid-patch in survivors
	Repaired int            `json:"repaired"` // of them, repaired by `hotpatch repair`
	Traps    uint64         `json:"traps"`    // traps the runtime's handler took
	InProc   uint64         `json:"inproc"`   // sites the handler made whole itself
	SpanMs   float64        `json:"span_ms"`  // the kills were spread over this
}

// TestKillNine SIGKILLs hotpatch at random points of a batch, per protocol,
// while four threads run every site in a loop, and counts what remains:
// target deaths (and by which signal) and sites left mid-patch. Each
// surviving target must be repairable: `hotpatch repair` leaves every site
// whole. flip and stop must never kill the target (every write is whole).
// A target that runs the runtime ("+runtime") must never die under any
// protocol: its SIGTRAP handler takes a trap at a listed site that no
// tracer took (D89, D90). Without the runtime (or with one older than the
// in-flight table), under int3 and int3-async a thread that reaches an
// int3 after hotpatch died still dies of SIGTRAP, the residual risk
// docs/protocols.md states with this test's figure; a death by any other
// signal (a thread released with its PC past the int3, issue 11) fails the
// test.
func TestKillNine(t *testing.T) {
	testutil.RequirePtrace(t)
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d, %d trials per protocol", seed, killTrials())
	lib := testutil.Runtime(t, "gcc")
	for _, c := range []struct {
		placeholder, protocol string
		runtime               bool
	}{
		{"flip", ProtoFlip, false}, {"nop", ProtoStop, false}, {"nop", ProtoInt3, false}, {"nop", ProtoInt3Async, false},
		{"nop", ProtoInt3, true}, {"nop", ProtoInt3Async, true},
	} {
		name := c.protocol
		if c.runtime {
			name += "+runtime"
		}
		t.Run(name, func(t *testing.T) {
			start := func() *subject {
				if c.runtime {
					return startMTEnv(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, c.placeholder, true, lib, nil)
				}
				return startMT(t, testutil.Spec{Compiler: "gcc", Opt: "-O2"}, c.placeholder, true)
			}
			s := start()
			var traps, inproc uint64
			restart := func() { s = start() }
			bin := testutil.Command(t, "hotpatch")
			args := func(on bool) []string {
				verb := "--disable"
				if on {
					verb = "--enable"
				}
				return append([]string{"--pid", fmt.Sprint(s.Pid), "--protocol", c.protocol, verb, "*"}, s.probeArgs...)
			}
			// How long one whole run takes, to spread the kills over it.
			var runs []time.Duration
			for i := 0; i < 3; i++ {
				start := time.Now()
				if out, err := testutil.CombinedOutputBound(exec.Command(bin, args(i%2 == 0)...)); err != nil {
					t.Fatalf("hotpatch: %v: %s", err, out)
				}
				runs = append(runs, time.Since(start))
			}
			sort.Slice(runs, func(i, j int) bool { return runs[i] < runs[j] })
			span := runs[1] + runs[1]/5
			deaths, torn, repaired := 0, 0, 0
			bySig := map[string]int{}
			for trial := 0; trial < killTrials(); trial++ {
				hp := exec.Command(bin, args(trial%2 == 0)...)
				if err := testutil.StartBound(hp); err != nil {
					t.Fatal(err)
				}
				// A random point of the run: a timer, not synchronisation.
				time.Sleep(time.Duration(rng.Int63n(int64(span))))
				_ = hp.Process.Kill()
				_ = hp.Wait()
				alive := progressOrDeath(t, s, 20000)
				var listed cmdResult
				if alive {
					// A death right after the progress is a death too (the
					// list fails on a dead process).
					listed = command(t, "hotpatch", append([]string{"--pid", fmt.Sprint(s.Pid), "list", "--json"}, s.probeArgs...)...)
					alive = listed.Code == 0 || s.Alive()
				}
				if !alive {
					err := s.Wait()
					var ee *exec.ExitError
					sig := "exit"
					if errors.As(err, &ee) {
						if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
							sig = unix.SignalName(ws.Signal()) // "SIGTRAP": the table's "by" column
						}
					}
					deaths++
					bySig[sig]++
					if sig != "SIGTRAP" {
						t.Errorf("trial %d: target died of %s, not of an int3 left in its text", trial, sig)
					}
					if c.runtime {
						t.Errorf("trial %d: a target running the runtime died of %s", trial, sig)
					}
					restart()
					continue
				}
				if listed.Code != 0 {
					t.Fatalf("trial %d: list: exit %d: %s", trial, listed.Code, listed.Stderr)
				}
				var sts []ProbeState
				if err := json.Unmarshal([]byte(listed.Stdout), &sts); err != nil {
					t.Fatalf("trial %d: list --json: %v", trial, err)
				}
				for _, st := range sts {
					if st.State == stateTorn {
						torn++
					}
				}
				r := command(t, "hotpatch", append([]string{"repair", "--pid", fmt.Sprint(s.Pid)}, s.probeArgs...)...)
				if r.Code != 0 {
					t.Fatalf("trial %d: repair: exit %d: %s", trial, r.Code, r.Stderr)
				}
				repaired += strings.Count(r.Stdout, "repaired ")
				for _, st := range s.states(t) {
					if st.State != "on" && st.State != "off" {
						t.Fatalf("trial %d: after repair probe %d (%s %s) is %s: %s", trial, st.ID, st.Kind, st.Function, st.State, st.Bytes)
					}
				}
			}
			if c.runtime {
				traps, inproc, _ = inflightCounters(t, s)
			}
			t.Logf("%s: %d kills spread over %v: %d target deaths %v; %d sites left mid-patch in survivors, %d repaired; the runtime's handler took %d traps, repaired %d sites",
				name, killTrials(), span, deaths, bySig, torn, repaired, traps, inproc)
			if out := os.Getenv(EnvKillNineOut); out != "" {
				row, _ := json.Marshal(killRow{Protocol: c.protocol, Runtime: c.runtime, Kills: killTrials(), Deaths: deaths, BySig: bySig,
					Torn: torn, Repaired: repaired, Traps: traps, InProc: inproc, SpanMs: float64(span.Microseconds()) / 1000})
				f, err := os.OpenFile(out, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				_, err = f.Write(append(row, '\n'))
				if cerr := f.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if (c.protocol == ProtoFlip || c.protocol == ProtoStop) && deaths > 0 {
				t.Errorf("%s: %d target deaths; this protocol writes only whole sites", c.protocol, deaths)
			}
			if torn != repaired {
				t.Errorf("%d sites seen mid-patch, %d repaired", torn, repaired)
			}
			s.finish(t)
		})
	}
}
