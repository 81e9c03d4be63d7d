/* edgeprobe_rings.c: the per-thread event rings (EDGEPROBE_TRACE).
 *
 * Owns the writing side of each thread's ring in the region: single
 * producer (the thread itself: ring_head, with release order on each
 * publish), single consumer (hotpatch, which advances ring_tail). A full ring
 * drops the event and counts it (ring_dropped); it never blocks and never
 * overwrites unread events.
 *
 * Locking: none; async-signal-safe (a handler's hook that interrupts a hook of
 * the same thread is dropped before it gets here, so one writer at a time).
 */
#include "edgeprobe_internal.h"

/* An event of this thread (EDGEPROBE_TRACE); dropped and counted when the
 * ring is full. */
EP_SHARED void ep_trace(struct ep_thread *th, uint32_t kind, uint64_t key) {
	if (!ep.ring_events)
		return;
	uint64_t h = th->ring_head;
	if (h - th->ring_tail_cache >= ep.ring_events) {
		th->ring_tail_cache = __atomic_load_n(&th->ring_tail, __ATOMIC_ACQUIRE);
		if (h - th->ring_tail_cache >= ep.ring_events) {
			OWN_ADD(&th->ring_dropped, 1);
			return;
		}
	}
	struct ep_event *e = ep_ring(th) + (h & ep.ring_mask);
	STORE(&e->tsk, ((uint64_t)kind << EP_EV_KIND_SHIFT) | (ep_mono_ns() & EP_EV_TS_MASK));
	STORE(&e->fn, key);
	__atomic_store_n(&th->ring_head, h + 1, __ATOMIC_RELEASE);
}

/* The thread event a thread's ring starts with (slot claim). */
EP_SHARED_COLD void ep_trace_thread(struct ep_thread *got, pid_t tid) {
	uint64_t h = got->ring_head;
	uint64_t tail = __atomic_load_n(&got->ring_tail, __ATOMIC_ACQUIRE);
	if (h - tail < ep.ring_events) {
		struct ep_event *e = ep_ring(got) + (h & ep.ring_mask);
		e->tsk = ((uint64_t)EP_EV_THREAD << EP_EV_KIND_SHIFT) | (ep_mono_ns() & EP_EV_TS_MASK);
		e->fn = (uint64_t)tid;
		__atomic_store_n(&got->ring_head, h + 1, __ATOMIC_RELEASE);
	} else {
		OWN_ADD(&got->ring_dropped, 1);
	}
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
