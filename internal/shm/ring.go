package shm

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Event is one trace record.
type Event struct {
	Kind   int    // EvEnter, EvExit, EvThread, EvData
	TimeNs uint64 // CLOCK_MONOTONIC ns (0 for EvData)
	Addr   uint64 // function key (KeyBare may be set); the tid for EvThread
	Seq    uint64 // position in the slot's ring (monotonic per slot)
	// EvData only: DataArgs or DataRet, the plan spec the runtime used, and
	// the payload words (runtime/edgeprobe_shm.h). Data is only valid
	// during the callback that receives it.
	Sub  int
	Spec uint64
	Data []uint64
}

func (r *Region) ring(slot int) (*threadSlot, uint64, error) {
	if slot < 0 || uint64(slot) >= uint64(r.hdr.MaxThreads) {
		return nil, 0, fmt.Errorf("shm: slot %d of %d: %w", slot, r.hdr.MaxThreads, ErrNoSlot)
	}
	return r.slotAt(uint64(slot)), r.hdr.RingOff + uint64(slot)*r.hdr.RingStride, nil
}

func (r *Region) cell(base, seq uint64) *event {
	return (*event)(unsafe.Pointer(&r.mem[base+(seq&uint64(r.hdr.RingEvents-1))*eventSize]))
}

func (r *Region) eventAt(base, seq uint64) Event {
	e := r.cell(base, seq)
	tsk := atomic.LoadUint64(&e.TSK)
	return Event{Kind: int(tsk >> evKindShift), TimeNs: tsk & evTSMask, Addr: atomic.LoadUint64(&e.Fn), Seq: seq}
}

// dataAt completes the EvData event ev at seq (its header cell read) with
// its payload, read into buf; it returns the number of cells the record
// takes (header included), or 0 if the record claims cells past head (a
// corrupt ring: the caller stops there).
func (r *Region) dataAt(base, seq, head uint64, ev *Event, buf []uint64) (uint64, []uint64) {
	tsk := atomic.LoadUint64(&r.cell(base, seq).TSK)
	slots := (tsk >> dataSlotsShift) & 0xff
	if seq+1+slots > head {
		return 0, buf
	}
	ev.Sub = int(tsk>>dataSubShift) & 3
	ev.Spec = tsk & dataSpecMask
	ev.TimeNs = 0
	buf = buf[:0]
	for i := uint64(0); i < slots; i++ {
		c := r.cell(base, seq+1+i)
		buf = append(buf, atomic.LoadUint64(&c.TSK), atomic.LoadUint64(&c.Fn))
	}
	ev.Data = buf
	return 1 + slots, buf
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
	for q := tail; q != head; {
		e := r.eventAt(base, q)
		n := uint64(1)
		if e.Kind == EvData {
			if n, _ = r.dataAt(base, q, head, &e, nil); n == 0 {
				break
			}
		}
		out = append(out, e)
		q += n
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
	for q := tail; q != head; {
		e := r.eventAt(base, q)
		n := uint64(1)
		if e.Kind == EvData {
			if n, r.dataBuf = r.dataAt(base, q, head, &e, r.dataBuf); n == 0 {
				break // a record claiming cells not written: skip the rest
			}
		}
		fn(e)
		q += n
	}
	atomic.StoreUint64(&s.RingTail, head)
	return int(head - tail), nil
}

// SetArgPlans writes the argument-capture plans (function key -> spec, see
// PlanSpec, PlanEntry, PlanExit) into the header's table; call it with
// CtlArgs clear. It fails if the table cannot hold them all.
func (r *Region) SetArgPlans(plans map[uint64]uint64) error {
	if !r.writable {
		return fmt.Errorf("shm: %s: %w", r.path, ErrReadOnly)
	}
	if r.hdr.Version < 5 {
		return fmt.Errorf("shm: %s: the runtime's layout version %d records no arguments (version 5 does): %w", r.path, r.hdr.Version, ErrArgPlans)
	}
	if len(plans) > ArgPlans {
		return fmt.Errorf("shm: %d functions to record arguments of, at most %d per capture: %w", len(plans), ArgPlans, ErrArgPlans)
	}
	r.ClearArgPlans()
	h := (*Header)(unsafe.Pointer(&r.mem[0]))
	for key, spec := range plans {
		home := uint32((key * 0x9E3779B97F4A7C15) >> 57)
		for p := uint32(0); ; p++ {
			e := &h.ArgPlan[(home+p)&(ArgPlans-1)]
			if atomic.LoadUint64(&e.Key) == 0 {
				atomic.StoreUint64(&e.Spec, spec)
				atomic.StoreUint64(&e.Key, key) // publishes the spec (Go's atomics are sequentially consistent)
				break
			}
		}
	}
	return nil
}

// ClearArgPlans empties the plan table (keys first: a hook that still finds
// a key reads a spec that is either the old one or 0, recording nothing).
func (r *Region) ClearArgPlans() {
	if !r.writable || r.hdr.Version < 5 {
		return
	}
	h := (*Header)(unsafe.Pointer(&r.mem[0]))
	for i := range h.ArgPlan {
		atomic.StoreUint64(&h.ArgPlan[i].Key, 0)
	}
	for i := range h.ArgPlan {
		atomic.StoreUint64(&h.ArgPlan[i].Spec, 0)
	}
}
