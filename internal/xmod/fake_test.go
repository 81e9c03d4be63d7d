package xmod_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// fake is a tracer over a byte map that fails its failAt-th step (every
// call that can fail counts as one step), so that every error path of
// every protocol can be driven, including the ones no live target produces
// on demand (a Sync timing out between phases, a write failing after the
// int3s are in).
type fake struct {
	mem    map[uint64]byte
	armed  map[uint64]bool
	steps  int
	failAt int
	failed string
}

func newFake(sites []xmod.Site, on bool) *fake {
	f := &fake{mem: map[uint64]byte{}, armed: map[uint64]bool{}}
	for _, s := range sites {
		form := s.Inert
		if on {
			form = s.Active
		}
		for i, b := range form {
			f.mem[s.Addr+uint64(i)] = b
		}
	}
	return f
}

func (f *fake) step(what string) error {
	f.steps++
	if f.steps == f.failAt {
		f.failed = what
		return fmt.Errorf("injected failure of step %d (%s)", f.steps, what)
	}
	return nil
}

func (f *fake) ReadMem(addr uint64, b []byte) error {
	if err := f.step("read"); err != nil {
		return err
	}
	for i := range b {
		b[i] = f.mem[addr+uint64(i)]
	}
	return nil
}

func (f *fake) WriteMem(addr uint64, b []byte) error {
	if err := f.step(fmt.Sprintf("write %d bytes at %#x", len(b), addr)); err != nil {
		return err
	}
	for i, c := range b {
		f.mem[addr+uint64(i)] = c
	}
	return nil
}

func (f *fake) Do(fn func() error) error { return fn() }
func (f *fake) ArmTrap(addr uint64) error {
	if err := f.step("arm"); err != nil {
		return err
	}
	f.armed[addr] = true
	return nil
}
func (f *fake) ReleaseTrap(addr uint64) (int, error) { delete(f.armed, addr); return 0, nil }
func (f *fake) ForkForm(addr uint64, form []byte) error {
	return f.step("fork form")
}
func (f *fake) Pause(time.Duration)            {}
func (f *fake) Pump()                          {}
func (f *fake) Sync(ctx context.Context) error { return f.step("sync") }
func (f *fake) StopAll(ctx context.Context) ([]ptrace.ThreadState, error) {
	return nil, f.step("stop all")
}
func (f *fake) ResumeAll() error { return f.step("resume all") }

// form says which whole form a site holds: "active", "inert" or what else.
func (f *fake) form(s xmod.Site) string {
	b := make([]byte, s.Len())
	for i := range b {
		b[i] = f.mem[s.Addr+uint64(i)]
	}
	switch {
	case bytes.Equal(b, s.Active):
		return "active"
	case bytes.Equal(b, s.Inert):
		return "inert"
	}
	return fmt.Sprintf("torn (% x)", b)
}

func fakeSites() []xmod.Site {
	return []xmod.Site{
		{Addr: 0x1000, Active: []byte{0xe8, 1, 2, 3, 4}, Inert: nop5, Name: "a"},
		{Addr: 0x1040, Active: []byte{0xe8, 5, 6, 7, 8}, Inert: nop5, Name: "b"},
		{Addr: 0x1080, Active: []byte{0xe8, 9, 9, 9, 9}, Inert: []byte{0x3d, 9, 9, 9, 9}, Name: "one-byte"},
	}
}

// TestRollbackEveryStep runs each protocol once to count its steps, then
// once per step with that step failing, and checks what the protocols
// promise: on return every site holds a whole form (its old one, or its new
// one), no trap is left armed, and a run that reports success did it all.
// Async runs as hotpatch drives it (Abort after a failed Start or Drain).
func TestRollbackEveryStep(t *testing.T) {
	opts := xmod.Int3Options{Wait: -1}
	protocols := map[string]func(f *fake, cs []xmod.Change) error{
		"int3": func(f *fake, cs []xmod.Change) error {
			_, err := xmod.Int3(context.Background(), f, cs, opts)
			return err
		},
		"int3-async": func(f *fake, cs []xmod.Change) error {
			a := xmod.NewAsync(f, opts)
			if _, err := a.Start(context.Background(), cs); err != nil {
				return errors.Join(err, a.Abort())
			}
			if err := a.Drain(context.Background()); err != nil {
				if a.Pending() > 0 {
					return errors.Join(err, a.Abort())
				}
				return err
			}
			return nil
		},
		"stop": func(f *fake, cs []xmod.Change) error {
			_, err := xmod.Stop(context.Background(), f, cs, xmod.StopOptions{})
			return err
		},
	}
	for name, run := range protocols {
		for _, on := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s-on=%v", name, on), func(t *testing.T) {
				sites := fakeSites()
				cs := changes(sites, on)
				clean := newFake(sites, !on)
				if err := run(clean, cs); err != nil {
					t.Fatalf("no failure injected: %v", err)
				}
				total := clean.steps
				for k := 1; k <= total; k++ {
					f := newFake(sites, !on)
					f.failAt = k
					err := run(f, cs)
					if err == nil && f.failed != "" && f.failed != "resume all" {
						// A failed step the protocol absorbed must not
						// leave anything half-done either (checked below).
						t.Logf("step %d (%s) failed, and the run still succeeded", k, f.failed)
					}
					for _, s := range sites {
						got := f.form(s)
						if got != "active" && got != "inert" {
							t.Errorf("step %d (%s) failed: %v holds %s; error %v", k, f.failed, s, got, err)
						}
						if err == nil && got != map[bool]string{true: "active", false: "inert"}[on] {
							t.Errorf("step %d (%s) failed but the run reported success with %v %s", k, f.failed, s, got)
						}
					}
					if len(f.armed) > 0 {
						t.Errorf("step %d (%s) failed: traps left armed at %v", k, f.failed, f.armed)
					}
				}
				t.Logf("%s: %d steps, each failed once", name, total)
			})
		}
	}
}

// TestRepairEveryStep: xmod.Repair with each of its steps failing leaves
// each torn site torn or whole (never worse) and no trap armed; without a
// failure every site is whole, in the form its back bytes name.
func TestRepairEveryStep(t *testing.T) {
	sites := fakeSites()
	torn := func() *fake {
		f := newFake(sites, false)
		f.mem[sites[0].Addr] = 0xcc // back bytes still the NOP's: repaired to inert
		for i, b := range sites[1].Active[1:] {
			f.mem[sites[1].Addr+1+uint64(i)] = b // back bytes of the call: repaired to active
		}
		f.mem[sites[1].Addr] = 0xcc
		return f
	}
	clean := torn()
	done, err := xmod.Repair(context.Background(), clean, sites, xmod.Int3Options{Wait: -1})
	if err != nil || len(done) != 2 {
		t.Fatalf("Repair: %v, %d repaired", err, len(done))
	}
	if clean.form(sites[0]) != "inert" || clean.form(sites[1]) != "active" || clean.form(sites[2]) != "inert" {
		t.Fatalf("after Repair: %s, %s, %s", clean.form(sites[0]), clean.form(sites[1]), clean.form(sites[2]))
	}
	for k := 1; k <= clean.steps; k++ {
		f := torn()
		f.failAt = k
		_, err := xmod.Repair(context.Background(), f, sites, xmod.Int3Options{Wait: -1})
		for _, s := range sites {
			if got := f.form(s); got != "active" && got != "inert" && f.mem[s.Addr] != 0xcc {
				t.Errorf("step %d (%s) failed: %v holds %s, worse than torn", k, f.failed, s, got)
			}
		}
		if len(f.armed) > 0 {
			t.Errorf("step %d (%s) failed: traps left armed", k, f.failed)
		}
		if err == nil && f.failed != "" {
			t.Errorf("step %d (%s) failed but Repair reported success", k, f.failed)
		}
	}
}
