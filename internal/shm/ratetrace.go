package shm

import (
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"
)

// A --rate trace (D55) traces exactly the calls the runtime's quotas let
// record in the trace's quota epochs. The hook decides a call's enter event
// by the epoch its quota slot was counted in (read after the slot's CAS),
// not by the control word it read at its start, so:
//   - start: the first epoch is stored (QtraceLo) before the events go on
//     and begins after: a slot of an earlier epoch never gives an event, a
//     slot of the first one always does;
//   - end: every function's quota word is sealed (marked used up in the
//     current epoch), so no call takes a slot any more; a hook that took one
//     before the seal set its thread's QuotaBusy before its CAS (the CAS's
//     lock orders the two), so waiting for each thread's QuotaBusy to be 0
//     once after the seal waits for every event of the trace's epochs.

var hdrQTrace = uint64(unsafe.Offsetof(Header{}.QtraceLo))

func (r *Region) qtrace() *uint64 { return (*uint64)(unsafe.Pointer(&r.mem[hdrQTrace])) }

// StartQuotaTrace turns on the control bits ctl (CtlTrace and what goes with
// it) for a --rate trace and starts its first quota epoch, in the order the
// hooks need (see above). Set the quota (SetQuota, CtlQuota) before. It
// returns the first epoch and, as StartTrace does, the trace's generation
// (D79): started after the epoch range is stored and before the first
// epoch begins, so a slot of the first epoch is always stamped with it or
// a later one (the hook reads its word after the slot's CAS), and a word
// of it read before the range (ep_quota_enter) finds the trace's range.
func (r *Region) StartQuotaTrace(ctl uint32) (first, gen uint32, err error) {
	if !r.writable {
		return 0, 0, r.readOnly()
	}
	first = r.QuotaEpoch() + 1
	if first == 0 {
		first = 1 // QtraceLo 0 means no such trace
	}
	atomic.StoreUint64(r.qtrace(), uint64(first))
	if gen, err = r.StartTrace(ctl); err != nil {
		return 0, 0, err
	}
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&r.mem[hdrQuotaE])), first)
	return first, gen, nil
}

// EndQuotaTrace ends a --rate trace's last epoch: it seals every function's
// quota word (no call records under the quota any more) and waits, up to
// wait, until every thread's hook that took a slot before has written its
// enter event. It returns, per function (run-time address), the calls its
// quota let record in the last epoch (each has its enter event in the
// rings now), and how many threads were still inside such a hook at the
// deadline (stopped, or abandoned by a signal handler's longjmp: their
// events may be missing).
// Leave the events on until it returns; ClearQuotaTrace after the last drain.
func (r *Region) EndQuotaTrace(wait time.Duration) (last map[uint64]uint32, busy int, err error) {
	if !r.writable {
		return nil, 0, r.readOnly()
	}
	last = map[uint64]uint32{}
	e, k := r.QuotaEpoch(), r.u32(hdrQuotaK)
	full := uint64(e)<<32 | uint64(k)
	d := r.data(r.threadRange(), r.keysRange())
	for i := uint64(0); i < r.FuncSlots(); i++ {
		key := uint64(0)
		if d.has(r.hdr.KeysOff+i*8, 8) {
			key = atomic.LoadUint64(r.keyAt(i))
		}
		if key == 0 {
			continue
		}
		q := &r.funcAt(i).Quota
		for {
			old := atomic.LoadUint64(q)
			if int32(uint32(old>>32)-e) > 0 {
				break // a newer epoch cannot be (we start them)
			}
			if old == full || atomic.CompareAndSwapUint64(q, old, full) {
				if uint32(old>>32) == e {
					last[key&^KeyBare] += uint32(old)
				}
				break
			}
		}
	}
	deadline := time.Now().Add(wait)
	for i := uint64(0); i < uint64(r.hdr.MaxThreads); i++ {
		if !r.slotUsed(d, i) {
			continue
		}
		s := r.slotAt(i)
		for atomic.LoadUint32(&s.QuotaBusy) != 0 {
			if atomic.LoadUint32(&s.State) != slotOwned {
				break // the thread is gone: its hooks ended with it
			}
			if time.Now().After(deadline) {
				busy++
				break
			}
			time.Sleep(20 * time.Microsecond) // a hook is nanoseconds long
		}
	}
	return last, busy, nil
}

// ClearQuotaTrace turns the --rate trace's epoch rule off (events follow
// CtlTrace again). Also part of undoing what a killed capture left.
func (r *Region) ClearQuotaTrace() error {
	if !r.writable {
		return r.readOnly()
	}
	atomic.StoreUint64(r.qtrace(), 0)
	return nil
}

// QuotaTrace returns the --rate trace's epoch range (0, 0: none).
func (r *Region) QuotaTrace() (lo, hi uint32) {
	v := atomic.LoadUint64(r.qtrace())
	return uint32(v), uint32(v >> 32)
}

func (r *Region) readOnly() error { return fmt.Errorf("shm: %s: %w", r.path, ErrReadOnly) }
