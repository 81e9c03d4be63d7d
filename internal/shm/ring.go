package shm

import (
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
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
	// Gen and Stamped (Consume, version 7 regions, D79): the generation of
	// the control|gen word the hook decided this event under, as the last
	// DataGen stamp before it in the ring says; Stamped is false when no
	// stamp of this slot has been read yet (the event predates every stamp
	// this reader saw) or the region has none (Stamps).
	Gen     uint32
	Stamped bool
}

// Stamps reports whether the runtime stamps its events with the generation
// they were decided under (layout version 7, D79).
func (r *Region) Stamps() bool { return r.hdr.Version >= 7 }

func (r *Region) ring(slot int) (*threadSlot, uint64, error) {
	if slot < 0 || uint64(slot) >= uint64(r.hdr.MaxThreads) {
		return nil, 0, fmt.Errorf("shm: slot %d of %d: %w", slot, r.hdr.MaxThreads, ErrNoSlot)
	}
	return r.slotAt(uint64(slot)), r.hdr.RingOff + uint64(slot)*r.hdr.RingStride, nil
}

// ringSize is the number of events a slot's ring holds now, read after its
// head: every event before that head was written with it (the runtime
// changes a ring's size only while the ring is empty). Regions before
// version 5 have one size, the header's.
func (r *Region) ringSize(s *threadSlot) uint64 {
	if n := atomic.LoadUint32(&s.RingSize); n != 0 && n <= r.hdr.RingEvents && n&(n-1) == 0 {
		return uint64(n)
	}
	if r.hdr.Version >= 5 && r.hdr.RingDef != 0 {
		return uint64(r.hdr.RingDef)
	}
	return uint64(r.hdr.RingEvents)
}

func (r *Region) cell(base, seq, size uint64) *event {
	return (*event)(unsafe.Pointer(&r.mem[base+(seq&(size-1))*eventSize]))
}

func (r *Region) eventAt(base, seq, size uint64) Event {
	e := r.cell(base, seq, size)
	tsk := atomic.LoadUint64(&e.TSK)
	return Event{Kind: int(tsk >> evKindShift), TimeNs: tsk & evTSMask, Addr: atomic.LoadUint64(&e.Fn), Seq: seq}
}

// dataAt completes the EvData event ev at seq (its header cell read) with
// its payload, read into buf; it returns the number of cells the record
// takes (header included), or 0 if the record claims cells past head (a
// corrupt ring: the caller stops there).
func (r *Region) dataAt(base, seq, head, size uint64, ev *Event, buf []uint64) (uint64, []uint64) {
	tsk := atomic.LoadUint64(&r.cell(base, seq, size).TSK)
	slots := (tsk >> dataSlotsShift) & 0xff
	if seq+1+slots > head {
		return 0, buf
	}
	ev.Sub = int(tsk>>dataSubShift) & 3
	ev.Spec = tsk & dataSpecMask
	ev.TimeNs = 0
	buf = buf[:0]
	for i := uint64(0); i < slots; i++ {
		c := r.cell(base, seq+1+i, size)
		buf = append(buf, atomic.LoadUint64(&c.TSK), atomic.LoadUint64(&c.Fn))
	}
	ev.Data = buf
	return 1 + slots, buf
}

// window returns the readable range [tail, head) of a slot's ring and the
// ring's size for it.
func (r *Region) window(s *threadSlot) (tail, head, size uint64) {
	head = atomic.LoadUint64(&s.RingHead)
	tail = atomic.LoadUint64(&s.RingTail)
	size = r.ringSize(s)
	if head-tail > size { // a consumer raced us, or the slot is corrupt: keep the newest events
		tail = head - size
	}
	return tail, head, size
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
	tail, head, size := r.window(s)
	out := make([]Event, 0, head-tail)
	for q := tail; q != head; {
		e := r.eventAt(base, q, size)
		n := uint64(1)
		if e.Kind == EvData {
			if n, _ = r.dataAt(base, q, head, size, &e, nil); n == 0 {
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
// at a time. It returns the number of ring cells consumed. DataGen stamps
// are not passed: each event carries the stamp in force (Event.Gen), which
// this Region remembers per slot from one call to the next.
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
	tail, head, size := r.window(s)
	gen, stamped := r.stamps[slot]
	for q := tail; q != head; {
		e := r.eventAt(base, q, size)
		n := uint64(1)
		if e.Kind == EvData {
			if n, r.dataBuf = r.dataAt(base, q, head, size, &e, r.dataBuf); n == 0 {
				break // a record claiming cells not written: skip the rest
			}
			if e.Sub == DataGen && r.Stamps() {
				gen, stamped = uint32(e.Spec), true
				q += n
				continue
			}
		}
		e.Gen, e.Stamped = gen, stamped
		fn(e)
		q += n
	}
	if stamped {
		if r.stamps == nil {
			r.stamps = map[int]uint32{}
		}
		r.stamps[slot] = gen
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

// DropArgStrings turns the string copies of every plan off (the other
// words stay planned), while CtlArgs may be on: each spec is one atomic
// word the runtime's hook loads once, so a hook records either the old
// plan or the new one, and its record carries the spec it used. A hook
// already past its load still copies its strings.
func (r *Region) DropArgStrings() {
	if !r.writable || r.hdr.Version < 5 {
		return
	}
	h := (*Header)(unsafe.Pointer(&r.mem[0]))
	for i := range h.ArgPlan {
		e := &h.ArgPlan[i]
		if atomic.LoadUint64(&e.Key) == 0 {
			continue
		}
		spec := atomic.LoadUint64(&e.Spec)
		if n := spec &^ (0x3f<<16 | PlanRStr); n != spec {
			atomic.StoreUint64(&e.Spec, n)
		}
	}
}

// ArgStrings reports whether any plan in the table copies a string.
func (r *Region) ArgStrings() bool {
	if r.hdr.Version < 5 {
		return false
	}
	h := (*Header)(unsafe.Pointer(&r.mem[0]))
	for i := range h.ArgPlan {
		e := &h.ArgPlan[i]
		if atomic.LoadUint64(&e.Key) != 0 && atomic.LoadUint64(&e.Spec)&(0x3f<<16|PlanRStr) != 0 {
			return true
		}
	}
	return false
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

// RingCapacity is the largest ring size a capture can ask for (the events
// each slot's ring reserves), RingDefault the size rings start with.
func (r *Region) RingCapacity() uint32 { return r.hdr.RingEvents }

// RingDefault is the size rings start with (EDGEPROBE_RING_EVENTS).
func (r *Region) RingDefault() uint32 {
	if r.hdr.Version >= 5 && r.hdr.RingDef != 0 {
		return r.hdr.RingDef
	}
	return r.hdr.RingEvents
}

// SetRingEvents asks every thread's ring to hold n events (a power of two
// up to RingCapacity): each thread takes the size at its next event once
// its ring is empty (drain the rings first). 0 asks for the default.
func (r *Region) SetRingEvents(n uint32) error {
	if !r.writable {
		return fmt.Errorf("shm: %s: %w", r.path, ErrReadOnly)
	}
	if n == 0 {
		n = r.RingDefault()
	}
	if r.hdr.Version < 5 {
		if n == r.hdr.RingEvents {
			return nil
		}
		return fmt.Errorf("ring size %d: the runtime's layout version %d has rings of %d events set at its start (EDGEPROBE_RING_EVENTS); version 5 resizes them: %w", n, r.hdr.Version, r.hdr.RingEvents, ErrRingSize)
	}
	if n&(n-1) != 0 || n > r.hdr.RingEvents {
		return fmt.Errorf("ring size %d: a power of two up to %d (the capacity the process reserved at its start; EDGEPROBE_RING_MAX raises it): %w", n, r.hdr.RingEvents, ErrRingSize)
	}
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&r.mem[unsafe.Offsetof(Header{}.RingReq)])), n)
	return nil
}

// ReleaseRings gives back the memory of ring cells past the default size
// (the kernel frees the memfd's pages; a later write finds a zero page).
// Call it after a capture that asked for bigger rings has drained them.
func (r *Region) ReleaseRings() {
	if !r.writable || r.hdr.Version < 5 || r.hdr.RingEvents <= r.RingDefault() {
		return
	}
	page := uint64(os.Getpagesize())
	d := r.data(r.threadRange())
	for i := uint64(0); i < uint64(r.hdr.MaxThreads); i++ {
		if !r.slotUsed(d, i) {
			continue
		}
		base := r.hdr.RingOff + i*r.hdr.RingStride
		lo := (base + uint64(r.RingDefault())*eventSize + page - 1) &^ (page - 1)
		hi := (base + r.hdr.RingStride) &^ (page - 1)
		if hi > lo && hi <= uint64(len(r.mem)) {
			_ = unix.Madvise(r.mem[lo:hi], unix.MADV_REMOVE)
		}
	}
}

// RingDropped is the number of events slot's ring has dropped so far.
func (r *Region) RingDropped(slot int) uint64 {
	s, _, err := r.ring(slot)
	if err != nil {
		return 0
	}
	return atomic.LoadUint64(&s.RingDropped)
}
