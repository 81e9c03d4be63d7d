/* edgeprobe_rings.c: the per-thread event rings (EDGEPROBE_TRACE).
 *
 * Owns the writing side of each thread's ring in the region: single
 * producer (the thread itself: ring_head, with release order on each
 * publish), single consumer (hotpatch, which advances ring_tail). A full ring
 * drops the event and counts it (ring_dropped); it never blocks and never
 * overwrites unread events. Each slot's ring has its own size
 * (ep_thread.ring_size, up to the capacity ring_events the region reserves):
 * a capture asks for a size (header.ring_req) and each thread takes it at
 * its next event once its ring is empty, so no event is ever read with
 * another size than it was written with (docs/runtime.md, "Trace rings").
 *
 * Locking: none; async-signal-safe (a handler's hook that interrupts a hook of
 * the same thread is dropped before it gets here, so one writer at a time).
 */
#include "edgeprobe_internal.h"

/* The ring size a capture asked for (ring_req), once this slot's ring is
 * empty: every unconsumed event was written with the size in force, so a
 * reader indexes them all with the one it reads after the head. A bad
 * request (a reader's bug) means the default. */
EP_COLD uint32_t ep_ring_switch(struct ep_thread *th, uint32_t size, uint32_t req) {
	if (req == 0 || req > ep.ring_events || (req & (req - 1)))
		req = LOAD(&ep.hdr->ring_def);
	if (req == size || !req)
		return size;
	if (size && th->ring_head != __atomic_load_n(&th->ring_tail, __ATOMIC_ACQUIRE))
		return size; /* not drained yet: switch at a later event */
	STORE(&th->ring_size, req); /* ordered before the next head by its release store */
	return req;
}

/* This slot's ring size for its next event (0: no rings). */
EP_INLINE uint32_t ep_ring_size(struct ep_thread *th) {
	uint32_t size = th->ring_size;
	uint32_t req = LOAD(&ep.hdr->ring_req); /* the control word's cache line */
	if (unlikely(req != size))
		size = ep_ring_switch(th, size, req);
	return size;
}

/* An event of this thread (EDGEPROBE_TRACE): kind, and the gen of the
 * control|gen word that decided it, in kg (EP_KG); dropped and counted when
 * the ring is full. */
EP_SHARED void ep_trace(struct ep_thread *th, uint64_t kg, uint64_t key) {
	ep_trace_ts(th, (uint32_t)kg, key, ep_mono_ns(), (uint32_t)(kg >> 32));
}

/* An event whose gen differs from the slot's last stamp: the stamp record
 * first (D79), published with the event by one head update. A ring with
 * room for the stamp only gets the stamp, and the event is counted
 * dropped: the stamp must never be skipped, or the reader would take the
 * event for one of the stamp before. Out of line: once per thread per
 * capture. */
EP_COLD void ep_trace_stamped(struct ep_thread *th, uint32_t kind, uint64_t key, uint64_t mono, uint32_t gen) {
	uint32_t size = ep_ring_size(th);
	uint64_t h = th->ring_head;
	if (h - th->ring_tail_cache + 1 >= size) {
		th->ring_tail_cache = __atomic_load_n(&th->ring_tail, __ATOMIC_ACQUIRE);
		if (h - th->ring_tail_cache >= size) {
			OWN_ADD(&th->ring_dropped, 1);
			return;
		}
	}
	struct ep_event *ring = ep_ring(th);
	struct ep_event *s = ring + (h & (size - 1));
	STORE(&s->tsk, ((uint64_t)EP_EV_DATA << EP_EV_KIND_SHIFT) | ((uint64_t)EP_DATA_GEN << EP_DATA_SUB_SHIFT) | gen);
	STORE(&s->fn, 0);
	h++;
	th->ev_gen = gen;
	if (h - th->ring_tail_cache >= size) {
		__atomic_store_n(&th->ring_head, h, __ATOMIC_RELEASE);
		OWN_ADD(&th->ring_dropped, 1);
		return;
	}
	struct ep_event *e = ring + (h & (size - 1));
	STORE(&e->tsk, ((uint64_t)kind << EP_EV_KIND_SHIFT) | (mono & EP_EV_TS_MASK));
	STORE(&e->fn, key);
	__atomic_store_n(&th->ring_head, h + 1, __ATOMIC_RELEASE);
}

/* The same with its CLOCK_MONOTONIC time given (events written after the
 * fact: a minimum-duration filter's held-back enters, D32). An event whose
 * gen differs from the slot's last stamp gets a stamp record first
 * (ep_trace_stamped). A slot's ev_gen starts at 0, which no capture's
 * generation is (shm.Region.StartTrace skips it): events of gen 0
 * (EDGEPROBE_TRACE=1 before any capture) go unstamped, and a capture takes
 * an unstamped event for one from before it, which it is. */
EP_SHARED void ep_trace_ts(struct ep_thread *th, uint32_t kind, uint64_t key, uint64_t mono, uint32_t gen) {
	if (!ep.ring_events)
		return;
	if (unlikely(th->ev_gen != gen)) {
		ep_trace_stamped(th, kind, key, mono, gen);
		return;
	}
	uint32_t size = ep_ring_size(th);
	uint64_t h = th->ring_head;
	if (h - th->ring_tail_cache >= size) {
		th->ring_tail_cache = __atomic_load_n(&th->ring_tail, __ATOMIC_ACQUIRE);
		if (h - th->ring_tail_cache >= size) {
			OWN_ADD(&th->ring_dropped, 1);
			return;
		}
	}
	struct ep_event *e = ep_ring(th) + (h & (size - 1));
	STORE(&e->tsk, ((uint64_t)kind << EP_EV_KIND_SHIFT) | (mono & EP_EV_TS_MASK));
	STORE(&e->fn, key);
	__atomic_store_n(&th->ring_head, h + 1, __ATOMIC_RELEASE);
}

/* The thread event a thread's ring starts with (slot claim). */
EP_SHARED_COLD void ep_trace_thread(struct ep_thread *got, pid_t tid) {
	uint32_t size = ep_ring_size(got);
	uint64_t h = got->ring_head;
	uint64_t tail = __atomic_load_n(&got->ring_tail, __ATOMIC_ACQUIRE);
	if (h - tail < size) {
		struct ep_event *e = ep_ring(got) + (h & (size - 1));
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
