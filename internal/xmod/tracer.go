package xmod

import (
	"context"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/ptrace"
)

// Tracer is what the int3, stop and repair protocols need of a tracer:
// *ptrace.Tracer in the tools, a fake that injects failures in the unit
// tests of every rollback path (fake_test.go). The methods are
// *ptrace.Tracer's; see there for their contracts.
type Tracer interface {
	Mem
	Do(fn func() error) error
	ArmTrap(addr uint64) error
	ReleaseTrap(addr uint64) (int, error)
	ForkForm(addr uint64, form []byte) error
	Pause(d time.Duration)
	Pump()
	Sync(ctx context.Context) error
	StopAll(ctx context.Context) ([]ptrace.ThreadState, error)
	ResumeAll() error
}

var _ Tracer = (*ptrace.Tracer)(nil)
