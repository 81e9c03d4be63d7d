package shm

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Event is one trace record.
type Event struct {
	Kind   int    // EvEnter, EvExit, EvThread
	TimeNs uint64 // CLOCK_MONOTONIC ns
	Addr   uint64 // function key (KeyBare may be set); the tid for EvThread
	Seq    uint64 // position in the slot's ring (monotonic per slot)
}

func (r *Region) ring(slot int) (*threadSlot, uint64, error) {
	if slot < 0 || uint64(slot) >= uint64(r.hdr.MaxThreads) {
		return nil, 0, fmt.Errorf("shm: slot %d of %d: %w", slot, r.hdr.MaxThreads, ErrNoSlot)
	}
	return r.slotAt(uint64(slot)), r.hdr.RingOff + uint64(slot)*r.hdr.RingStride, nil
}

func (r *Region) eventAt(base, seq uint64) Event {
	e := (*event)(unsafe.Pointer(&r.mem[base+(seq&uint64(r.hdr.RingEvents-1))*eventSize]))
	tsk := atomic.LoadUint64(&e.TSK)
	return Event{Kind: int(tsk >> evKindShift), TimeNs: tsk & evTSMask, Addr: atomic.LoadUint64(&e.Fn), Seq: seq}
}

// window returns the readable range [tail, head) of a slot's ring.
func (r *Region) window(s *threadSlot) (tail, head uint64) {
	head = atomic.LoadUint64(&s.RingHead)
	tail = atomic.LoadUint64(&s.RingTail)
	n := uint64(r.hdr.RingEvents)
	if head-tail > n { // a consumer raced us, or the slot is corrupt: keep the newest n
		tail = head - n
	}
	return tail, head
}

// Events copies the unconsumed events of a thread slot without consuming
// them. If a consumer frees events while the copy is made, the producer may
// reuse their cells; those events are left out, so what is returned is
// always what the runtime wrote.
func (r *Region) Events(slot int) ([]Event, error) {
	s, base, err := r.ring(slot)
	if err != nil || r.hdr.RingEvents == 0 {
		return nil, err
	}
	tail, head := r.window(s)
	out := make([]Event, 0, head-tail)
	for q := tail; q != head; q++ {
		out = append(out, r.eventAt(base, q))
	}
	// Cells below the tail now in force may have been rewritten.
	if t2 := atomic.LoadUint64(&s.RingTail); t2 > tail {
		drop := t2 - tail
		if drop > uint64(len(out)) {
			drop = uint64(len(out))
		}
		out = out[drop:]
	}
	return out, nil
}

// Consume reads the unconsumed events of a thread slot, passes them to fn in
// order and frees them for the producer. Only one consumer per slot may run
// at a time. It returns the number of events consumed.
func (r *Region) Consume(slot int, fn func(Event)) (int, error) {
	s, base, err := r.ring(slot)
	if err != nil {
		return 0, err
	}
	if !r.writable {
		return 0, fmt.Errorf("shm: %s: %w", r.path, ErrReadOnly)
	}
	if r.hdr.RingEvents == 0 {
		return 0, nil
	}
	tail, head := r.window(s)
	for q := tail; q != head; q++ {
		fn(r.eventAt(base, q))
	}
	atomic.StoreUint64(&s.RingTail, head)
	return int(head - tail), nil
}
