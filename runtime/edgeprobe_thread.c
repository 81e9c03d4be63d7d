/* edgeprobe_thread.c: per-thread state and the shadow stack's slow paths.
 *
 * Owns ep_tls (the thread's slot pointer, busy word, fentry return-address
 * stack pointer), the claim of a thread slot in the region (first hook of a
 * thread) and its release at thread exit, the busy word's staleness test
 * (ep_busy_live: a hook a signal handler longjmp'd out of), and the shadow
 * stack's rare paths: healing by stack position (ep_heal, ep_pop_unmatched,
 * ep_pop_to), exits with no frame or beyond the stored frames
 * (ep_exit_unframed, ep_exit_slow) and entries counted without a frame
 * (ep_count_entry). The hot push and pop are in edgeprobe_internal.h (D15).
 *
 * Locking: none. A thread's slot and shadow stack are written by that thread
 * only (OWN_ADD), shared counters with relaxed atomics; a slot is claimed by
 * CAS. Everything here may run in a signal handler interrupting a hook of the
 * same thread, and is only entered with the busy word set (or judged stale
 * here first). No libc except on the claim (region set-up, pthread_setspecific;
 * it saves and restores errno around them); ep_busy_live / ep_heal's rare
 * checks (process_vm_readv, sigaltstack) are raw system calls: a hook leaves
 * the program's errno as it found it.
 */
#include "edgeprobe_internal.h"

__thread struct ep_tls ep_tls __attribute__((tls_model("initial-exec"), visibility("hidden")));

/* ---- slot claim ---- */

/* Where glibc keeps a thread's id in its thread descriptor (pthread_self()),
 * learnt at the region's set-up and checked at every claim that asks the
 * kernel (D56): under seccomp a thread's first hook reads its id there
 * instead of calling gettid. -1: unknown or contradicted (such threads are
 * then not recorded under seccomp). */
static int ep_tid_off = -1;
#define EP_TID_SCAN 1024 /* bytes of the descriptor searched */

EP_SHARED_COLD void ep_tid_learn(void) {
	pid_t tid = (pid_t)ep_sys1(SYS_gettid, 0);
	const int32_t *w = (const int32_t *)(uintptr_t)pthread_self();
	int off = -1;
	for (int i = 0; w && i < EP_TID_SCAN / 4; i++) {
		if (w[i] == tid) {
			off = i * 4;
			break;
		}
	}
	__atomic_store_n(&ep_tid_off, off, __ATOMIC_RELAXED);
}

/* The calling thread's id from its descriptor, or 0. */
EP_STATIC pid_t ep_tid_nosys(void) {
	int off = __atomic_load_n(&ep_tid_off, __ATOMIC_RELAXED);
	if (off < 0)
		return 0;
	return (pid_t)LOAD((const int32_t *)(uintptr_t)((uint64_t)(uintptr_t)pthread_self() + (uint64_t)off));
}

/* A claim that asked the kernel: the descriptor must agree. */
EP_STATIC void ep_tid_check(pid_t tid) {
	int off = __atomic_load_n(&ep_tid_off, __ATOMIC_RELAXED);
	if (off >= 0 && ep_tid_nosys() != tid)
		__atomic_store_n(&ep_tid_off, -1, __ATOMIC_RELAXED);
}

/* Slow path of the first hook a thread runs (and of threads without a slot). */
EP_SHARED_COLD struct ep_thread *ep_claim(void) {
	uint64_t here = EP_HERE();
	struct ep_thread *s = ep_tls.slot;
	if (s == EP_TS_DEAD) {
		if (__atomic_load_n(&ep_state, __ATOMIC_ACQUIRE) == 2)
			ADD(&ep.hdr->late_drops, 1);
		return NULL;
	}
	if (s == EP_TS_OVERFLOW) {
		ADD(&ep.hdr->thread_drop_hits, 1);
		return NULL;
	}
	if (ep_tls.busy && ep_busy_live(NULL, here)) {
		ep_count_early_drop();
		return NULL;
	}
	ep_tls.busy_ret = (uint64_t)(uintptr_t)__builtin_return_address(0);
	SIGFENCE();
	ep_tls.busy = here;
	SIGFENCE();
	/* Region set-up and pthread_setspecific are libc and may set errno: the
	 * probed program's errno must not change under it. */
	int saved_errno = errno;
	struct ep_thread *got = NULL;
	if (!ep_ensure_init()) {
		ep_count_early_drop();
		goto out;
	}
	pid_t tid;
	if (ep_sys_off()) {
		/* Under seccomp (D56) no gettid: the id glibc keeps in the thread's
		 * descriptor; where that is unknown the thread is not recorded (its
		 * hooks count as thread_drop_hits). */
		tid = ep_tid_nosys();
		if (tid <= 0) {
			ep_tls.slot = EP_TS_OVERFLOW;
			ADD(&ep.hdr->nosys_threads, 1);
			ADD(&ep.hdr->thread_drop_hits, 1);
			goto out;
		}
	} else {
		tid = (pid_t)ep_sys1(SYS_gettid, 0);
		ep_tid_check(tid);
	}
	uint32_t n = ep.max_threads;
	uint32_t start = (uint32_t)tid % n;
	uint32_t idx = 0;
	for (uint32_t i = 0; i < n; i++) {
		idx = (start + i) % n;
		struct ep_thread *th = ep_slot(idx);
		uint32_t free_ = EP_SLOT_FREE;
		if (LOAD(&th->state) == EP_SLOT_FREE &&
		    __atomic_compare_exchange_n(&th->state, &free_, EP_SLOT_OWNED, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
			got = th;
			break;
		}
	}
	if (!got) {
		ep_tls.slot = EP_TS_OVERFLOW;
		ADD(&ep.hdr->thread_overflows, 1);
		ADD(&ep.hdr->thread_drop_hits, 1);
		goto out;
	}
	STORE(&got->index, idx);
	STORE(&got->tid, tid);
	STORE(&got->generation, got->generation + 1);
	STORE(&got->depth, 0);
	STORE(&got->filter_out_cg, 0); /* a verdict of the slot's last owner is not ours */
	STORE(&got->filter_lim_cg, 0);
	STORE(&got->claimed_mono, ep_mono_ns());
	ADD(&ep.hdr->threads_claimed, 1);
	ADD(&ep.hdr->threads_active, 1);
	if (ep_key_ok)
		pthread_setspecific(ep_key, got);
	ep_tls.frames = (uint64_t)(uintptr_t)ep_frames(got);
	SIGFENCE();
	ep_tls.slot = got;
	if ((LOAD(&ep.hdr->control) & EP_CTL_TRACE) && ep.ring_events)
		ep_trace_thread(got, tid);
out:
	errno = saved_errno;
	SIGFENCE();
	ep_tls.busy = 0;
	return got;
}

/* ---- the busy word ---- */

/* Read a word of our own memory that may no longer be mapped (a stack left
 * behind); 0 when it cannot be read. A system call: rare paths only. */
EP_STATIC uint64_t ep_peek(uint64_t a) {
	uint64_t v = 0;
	if (ep_self_read(&v, a, sizeof v) != (long)sizeof v)
		return 0;
	return v;
}

/* Whether the hook named by the busy word still runs: a signal handler
 * interrupted it and we are a hook of that handler (drop us), rather than a
 * handler having longjmp'd out of it (then the word is stale: clear it,
 * count the abandoned hook, go on). A running hook's return address is at
 * busy + 8; an abandoned one's frame has been left and, once we run at or
 * above it or anything has been called over it, no longer holds it. */
EP_SHARED_COLD int ep_busy_live(struct ep_thread *th, uint64_t here) {
	uint64_t b = ep_tls.busy;
	if (b == EP_BUSY_HARD)
		return 1;
	uint64_t got;
	if (here < b && b - here < (1u << 20)) {
		got = *(volatile uint64_t *)(uintptr_t)(b + 8); /* above us on this stack: mapped */
	} else if (ep_sys_off()) {
		/* Under seccomp (D56) neither the word nor the stack we run on can
		 * be checked: drop this hook (counted) rather than risk two hooks
		 * writing the thread's state at once. After a handler longjmp'd out
		 * of a hook, this thread's later hooks are dropped the same way. */
		ep_count_nosys();
		return 1;
	} else {
		got = ep_peek(b + 8);
	}
	/* A hook that interrupts a live one on the same stack runs below it
	 * (a signal frame is pushed under the interrupted one). At or above the
	 * busy frame we can only be a later hook on a stack the abandoned one
	 * left: a loop calling the same function from the same place rebuilds
	 * that frame with the same return address, which alone would make a
	 * stale word look live forever. A handler on an alternate signal stack
	 * may run anywhere: there only the return address can tell. */
	int above = here >= b; /* the word was read directly only below it: ep_sys_off() is 0 here */
	if (above) {
		stack_t ss;
		if (ep_on_altstack(&ss))
			above = 0;
	}
	if (!above && got == ep_tls.busy_ret)
		return 1;
	/* A handler interrupting us here (the read above may be a system call)
	 * can judge the same word: whoever clears it counts it, once. */
	uint64_t expect = b;
	if (__atomic_compare_exchange_n(&ep_tls.busy, &expect, 0, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
		if (th)
			OWN_ADD(&th->abandoned_hooks, 1);
		return 0;
	}
	return expect != 0; /* cleared by a handler: go on; set by one: not ours to judge */
}

/* ---- shadow stack: healing and slow exits ---- */

/* Count the stored frames [to, from) unmatched, popping from the top. */
EP_SHARED_COLD void ep_pop_unmatched(struct ep_thread *th, uint32_t from, uint32_t to) {
	struct ep_frame *fr = ep_frames(th);
	for (uint32_t j = from; j > to; j--) {
		fr[j - 1].flags = 0; /* no held-back enter survives its frame */
		if (ep_frame_skip(&fr[j - 1]))
			continue; /* a call its quota did not record: nothing to balance */
		ADD(&ep.funcs[fr[j - 1].gidx].unmatched, 1);
		OWN_ADD(&th->unmatched, 1);
	}
}

/* The exit of the skip frame at depth k (k - 1 is its index): frames above
 * it lost their exits; the call itself records nothing. */
EP_SHARED_COLD void ep_skip_exit(struct ep_thread *th, uint32_t k) {
	if (th->depth > k)
		ep_pop_unmatched(th, th->depth < ep.stack_depth ? th->depth : ep.stack_depth, k);
	STORE(&th->depth, k - 1);
	OWN_ADD(&th->quota_skips, 1);
}

/* Pop the shadow frames at depth >= lo: those stored counted unmatched, those
 * deeper than the shadow stack counted lost (their functions are unknown). */
EP_SHARED void ep_pop_to(struct ep_thread *th, uint32_t lo) {
	uint32_t depth = th->depth;
	if (depth <= lo)
		return;
	uint32_t stored = depth < ep.stack_depth ? depth : ep.stack_depth;
	if (stored > lo)
		ep_pop_unmatched(th, stored, lo);
	uint32_t top = stored > lo ? stored : lo;
	if (depth > top)
		OWN_ADD(&th->deep_lost, depth - top);
	STORE(&th->depth, lo);
}

EP_SHARED_COLD uint32_t ep_heal(struct ep_thread *th, uint32_t d, uint64_t sp, uint64_t site) {
	struct ep_frame *fr = ep_frames(th);
	uint32_t cap = ep.stack_depth;
	uint32_t k = d < cap ? d : cap, j = k;
	while (j > 0 && ep_frame_dead(&fr[j - 1], sp))
		j--;
	for (uint32_t i = j; i > 0 && fr[i - 1].sp == sp; i--)
		if (fr[i - 1].site == site)
			j = i - 1;
	if (j == k && d <= cap)
		return d;
	if (j < k && sp - fr[j].sp > EP_NEAR_STACK) {
		stack_t ss;
		if (ep_sys_off()) {
			/* Under seccomp (D56) the alternate stack cannot be asked for:
			 * this may be a signal handler on another stack, over live
			 * frames. Pop nothing; frames that were dead are found later
			 * (or counted when the shadow stack fills). */
			ep_count_nosys();
			return d;
		}
		if (ep_on_altstack(&ss)) {
			uint64_t lo = (uint64_t)(uintptr_t)ss.ss_sp, hi = lo + ss.ss_size;
			j = k;
			while (j > 0 && ep_frame_dead(&fr[j - 1], sp) && fr[j - 1].sp >= lo && fr[j - 1].sp < hi)
				j--;
			if (j == k)
				return d;
		}
	}
	if (d > cap) {
		/* the frames beyond the stored ones were deeper still: dead too */
		OWN_ADD(&th->deep_lost, d - cap);
		STORE(&th->depth, cap);
	}
	for (uint32_t i = k; i > j; i--) {
		STORE(&th->depth, i - 1);
		fr[i - 1].flags = 0; /* no held-back enter survives its frame */
		if (ep_frame_skip(&fr[i - 1]))
			continue;
		ADD(&ep.funcs[fr[i - 1].gidx].unmatched, 1);
		OWN_ADD(&th->unmatched, 1);
	}
	return j;
}

/* An exit with no frame to match it: counted, untimed, with its reason. */
EP_SHARED_COLD void ep_exit_unframed(struct ep_thread *th, uint64_t key, int why) {
	uint32_t g;
	struct ep_local *l = ep_lookup(th, key, &g);
	if (g == EP_NONE) {
		ADD(&ep.hdr->func_drop_exits, 1);
		return;
	}
	if (l)
		OWN_ADD(&l->exits, 1);
	else
		ADD(&ep.funcs[g].exits, 1);
	if (why == EP_UNFRAMED_ORPHAN) {
		ADD(&ep.funcs[g].orphans, 1);
		OWN_ADD(&th->orphans, 1);
	} else {
		ADD(&ep.funcs[g].deep_exits, 1);
	}
}

/* Everything but "the top frame is this call's": beyond the shadow stack,
 * then match by key (the newest frame of the function: frames above it lost
 * their exits), then by generation. */
EP_SHARED_COLD void ep_exit_slow(struct ep_thread *th, uint64_t key, uint64_t sp, uint64_t now) {
	uint32_t d = th->depth, cap = ep.stack_depth;
	struct ep_frame *frs = ep_frames(th);
	if (d > cap) {
		if (frs[cap - 1].sp >= sp) {
			/* at or below the last stored frame (whose callee's tail-called
			 * exit hook runs at its position at most): the exit of a frame
			 * deeper than the shadow stack; trust the nesting */
			STORE(&th->depth, d - 1);
			ep_exit_unframed(th, key, EP_UNFRAMED_DEEP);
			return;
		}
		/* above it: the deeper frames are gone */
		OWN_ADD(&th->deep_lost, d - cap);
		STORE(&th->depth, cap);
		d = cap;
	}
	uint32_t k = d;
	while (k > 0 && frs[k - 1].fn != key)
		k--;
	if (k == 0) {
		/* not on the stack: entered unseen */
		ep_exit_unframed(th, key, EP_UNFRAMED_ORPHAN);
		return;
	}
	if (k != d) {
		/* frames nested in it lost their exits */
		ep_pop_unmatched(th, d, k);
		STORE(&th->depth, k);
	}
	struct ep_frame *fr = frs + k - 1;
	if (ep_frame_skip(fr)) {
		ep_skip_exit(th, k);
		return;
	}
	STORE(&th->depth, k - 1);
	if (unlikely(ep_frame_stale(fr))) {
		/* pushed before the probes were last turned on: that call's exit was
		 * missed and this exit belongs to a call entered unseen */
		ep_pop_unmatched(th, k, k - 1);
		ep_exit_unframed(th, key, EP_UNFRAMED_ORPHAN);
		return;
	}
	ep_exit_frame(th, fr, now);
}

/* ---- quotas under a --rate trace (D55) ---- */

#define EP_Q_SKIP 0    /* over the quota: record nothing */
#define EP_Q_CTL 1     /* recorded; its event follows the control word (no --rate trace) */
#define EP_Q_TRACE 2   /* recorded in one of the trace's epochs: its enter event is written */
#define EP_Q_NOTRACE 3 /* recorded outside the trace's epochs: no enter event */

/* Take a quota slot and decide the call's enter event by the epoch the
 * slot was counted in, not by the control word the hook read at its start
 * (which may predate the trace's start or end): every slot of the trace's
 * epochs, and no other, gives an event, so the trace holds exactly the calls
 * the quota let record. The range is read after the CAS (a locked
 * instruction, sequentially consistent), so a slot of the first epoch sees
 * qtrace_lo, stored before that epoch began. With EP_Q_TRACE th->quota_busy
 * stays 1 until the caller has written the event (ep_quota_done): the
 * capture's end waits for it (docs/runtime.md, "Rate limits").
 * *cg: the control|gen word the event is decided and stamped under (D79),
 * read after the CAS and before the range: a slot of a trace's first epoch
 * was taken after that trace started its generation (stored before the
 * epoch began), so its word is the trace's; and a word of the trace's
 * generation is read before a range stored before it, so a slot of an
 * earlier trace's epoch read with it finds the new range and no event. */
EP_INLINE int ep_quota_enter(struct ep_thread *th, struct ep_func *f, uint64_t *cg) {
	uint32_t e;
	if (!ep_quota_take(f, &e, &th->quota_busy))
		return EP_Q_SKIP;
	*cg = __atomic_load_n((const uint64_t *)(const void *)&ep.hdr->control, __ATOMIC_ACQUIRE);
	uint64_t qt = __atomic_load_n((const uint64_t *)(const void *)&ep.hdr->qtrace_lo, __ATOMIC_SEQ_CST);
	uint32_t lo = (uint32_t)qt, hi = (uint32_t)(qt >> 32);
	int r = EP_Q_CTL;
	if (lo)
		r = (int32_t)(e - lo) >= 0 && (!hi || (int32_t)(hi - e) >= 0) ? EP_Q_TRACE : EP_Q_NOTRACE;
	if (r != EP_Q_TRACE)
		STORE(&th->quota_busy, 0);
	return r;
}
_Static_assert(offsetof(struct ep_header, qtrace_hi) == offsetof(struct ep_header, qtrace_lo) + 4 &&
                   offsetof(struct ep_header, qtrace_lo) % 8 == 0,
               "ep_quota_enter reads the trace's epoch range as one word");

/* The enter event of a call ep_quota_enter counted (q) under the word cg,
 * if it gets one: by the epoch (EP_Q_TRACE), or by cg's own EP_CTL_TRACE
 * outside a --rate trace (EP_Q_CTL), not by the control word the hook read
 * when it began. */
EP_STATIC void ep_quota_event(struct ep_thread *th, uint64_t cg, int q, uint64_t key, uint32_t depth) {
	if (q == EP_Q_TRACE) {
		ep_trace_cg(th, cg, EP_EV_ENTER, key, depth);
		__atomic_store_n(&th->quota_busy, 0, __ATOMIC_RELEASE); /* after the event's head */
	} else if (q == EP_Q_CTL && ((uint32_t)cg & EP_CTL_TRACE)) {
		ep_trace_cg(th, cg, EP_EV_ENTER, key, depth);
	}
}

/* Every enter the inlined ep_enter does not take (edgeprobe_internal.h): the
 * function not at its home entry of the thread's cache (first sight, a
 * collision, no cache), frames to heal, the shadow stack full. */
EP_SHARED int ep_enter_slow(struct ep_thread *th, uint64_t key, uint32_t ctl, uint64_t sp, uint64_t site, int mark) {
	uint32_t g;
	struct ep_local *l = ep_lookup(th, key, &g);
	if (unlikely(g == EP_NONE)) {
		ADD(&ep.hdr->func_drop_enters, 1);
		return 0;
	}
	int q = EP_Q_CTL;
	uint64_t qcg = 0;
	if (unlikely(ctl & EP_CTL_QUOTA) && (q = ep_quota_enter(th, &ep.funcs[g], &qcg)) == EP_Q_SKIP) {
		/* over its quota: record nothing; a cyg call gets a skip frame so
		 * that its exit records nothing either (beyond the shadow stack
		 * there is no frame to mark: such a call is recorded, D31) */
		uint32_t d = th->depth;
		uint32_t top = d < ep.stack_depth ? d : ep.stack_depth;
		if (top && ep_frames(th)[top - 1].sp <= sp)
			d = ep_heal(th, d, sp, site);
		if (d < ep.stack_depth) {
			OWN_ADD(&th->quota_skips, 1);
			if (!mark)
				return 0;
			struct ep_frame *fr = ep_frames(th) + d;
			fr->fn = key;
			fr->sp = sp;
			fr->site = site;
			fr->gidx = EP_NONE;
			fr->loff = 0;
			fr->gen = ep_gen_now();
			fr->flags = 0;
			fr->ts = 0;
			SIGFENCE();
			STORE(&th->depth, d + 1);
			return 1;
		}
	}
	if (likely(l != NULL))
		OWN_ADD(&l->entries, 1);
	else
		ADD(&ep.funcs[g].entries, 1);
	uint32_t d = th->depth;
	uint32_t top = d < ep.stack_depth ? d : ep.stack_depth;
	if (top && ep_frames(th)[top - 1].sp <= sp)
		d = ep_heal(th, d, sp, site);
	if (likely(d < ep.stack_depth)) {
		struct ep_frame *fr = ep_frames(th) + d;
		fr->fn = key;
		fr->sp = sp;
		fr->site = site;
		fr->gidx = g;
		fr->loff = l ? ep_loff(l, th) : 0;
		fr->gen = ep_gen_now();
		fr->flags = 0;
		fr->ts = (ctl & EP_CTL_NOTIME) ? 0 : ep_ticks();
	} else {
		/* deeper than the shadow stack: counted, untimed; its exit is
		 * matched by nesting (ep_exit_slow) */
		OWN_ADD(&th->stack_overflows, 1);
		ADD(&ep.funcs[g].deep_entries, 1);
	}
	SIGFENCE();
	STORE(&th->depth, d + 1);
	if (unlikely(ctl & EP_CTL_QUOTA))
		ep_quota_event(th, qcg, q, key, d);
	else if (unlikely(ctl & EP_CTL_TRACE))
		ep_trace_at(th, ctl, EP_EV_ENTER, key, d);
	return 1;
}

/* Entry without an exit probe: count (and trace) it, push nothing. deep: it
 * would have had one, but the return-address stack is full. */
EP_SHARED void ep_count_entry(struct ep_thread *th, uint64_t key, uint32_t ctl, int deep) {
	uint32_t g;
	struct ep_local *l = ep_lookup(th, key, &g);
	if (g == EP_NONE) {
		ADD(&ep.hdr->func_drop_enters, 1);
		return;
	}
	int q = EP_Q_CTL;
	uint64_t qcg = 0;
	if (unlikely(ctl & EP_CTL_QUOTA) && (q = ep_quota_enter(th, &ep.funcs[g], &qcg)) == EP_Q_SKIP) {
		OWN_ADD(&th->quota_skips, 1);
		return;
	}
	if (l)
		OWN_ADD(&l->entries, 1);
	else
		ADD(&ep.funcs[g].entries, 1);
	if (deep)
		ADD(&ep.funcs[g].deep_entries, 1);
	if (unlikely(ctl & EP_CTL_QUOTA))
		ep_quota_event(th, qcg, q, key, th->depth);
	else if (ctl & EP_CTL_TRACE)
		ep_trace_at(th, ctl, EP_EV_ENTER, key, th->depth);
}

/* ---- trace filters (D32) ---- */

/* The thread's verdict on a capture's depth and thread filters (D58): its
 * calls at shadow-stack depth >= the result are filtered out (0: every call,
 * the thread list leaves this thread out; ~0: none). Under a control|gen
 * word cg that is only tracing with filters, the verdict is kept in the slot
 * for as long as that word stands (ep_filter_out, and the cyg hooks'
 * assembly, which make the same verdict: edgeprobe_cyg.S FILTER_VERDICT):
 * a capture starts a new generation after it sets its filters, so none
 * outlives them. A limit is stored before the word that makes it valid. */
EP_SHARED_COLD uint32_t ep_filter_verdict(struct ep_thread *th, uint64_t cg) {
	uint32_t lim = 0;
	int32_t tid = th->tid;
	for (uint32_t i = 0; i < EP_FILTER_TIDS; i++) {
		int32_t t = LOAD(&ep.hdr->filter_tid[i]);
		if (t == tid || (!t && i == 0)) { /* listed, or no list */
			lim = LOAD(&ep.hdr->filter_depth);
			if (!lim)
				lim = ~0u;
			break;
		}
		if (!t)
			break;
	}
	if (((uint32_t)cg & (EP_CTL_SLOWPATH | EP_CTL_FILTER)) == (EP_CTL_TRACE | EP_CTL_FILTER)) {
		if (!lim) {
			STORE(&th->filter_out_cg, cg);
		} else {
			STORE(&th->filter_lim, lim);
			SIGFENCE();
			STORE(&th->filter_lim_cg, cg);
		}
	}
	return lim;
}

/* CLOCK_MONOTONIC ns of a hook clock reading (TSC ticks, or ns already). */
EP_STATIC uint64_t ep_ticks_mono(uint64_t t) {
	uint64_t t0 = ep.hdr->tsc0, m0 = ep.hdr->mono0;
	return t >= t0 ? m0 + ep_to_ns(t - t0) : m0 - ep_to_ns(t0 - t);
}

/* A call's event under a minimum duration (filter_min_ns, D32). An enter is
 * held back: its frame is marked pending, and nothing is written. At the
 * exit of a pending call that lasted long enough, the held-back enters of
 * its pending callers (outermost first: a caller lasts at least as long as
 * its callee, so it qualifies too), its own enter and its exit are written,
 * all timed from the frames' clock readings, so the thread's stream stays
 * nested; the callers are marked written, and their exits are written when
 * they come. Only calls with a stored, timed frame can be judged: others
 * (beyond the shadow stack, entries without an exit probe, untimed, orphan
 * exits) are left out. Frames leave the stack with their flags cleared, so a
 * frame at or above the depth never holds a stale mark. */
EP_SHARED_COLD int ep_trace_held(struct ep_thread *th, uint32_t kind, uint64_t key, uint32_t depth, uint32_t gen) {
	if (depth >= ep.stack_depth || (kind != EP_EV_ENTER && kind != EP_EV_EXIT))
		return 0;
	struct ep_frame *frs = ep_frames(th), *fr = frs + depth;
	uint32_t ep_ = LOAD(&ep.hdr->filter_epoch) << EP_FR_EPOCH_SHIFT;
	if (kind == EP_EV_ENTER) {
		if (fr->fn != key || !fr->ts || th->depth != depth + 1)
			return 0;
		fr->flags = ep_ | EP_FR_PENDING;
		return 0;
	}
	uint32_t f = fr->flags;
	fr->flags = 0;
	if (fr->fn != key || (f & ~3u) != ep_ || !(f & (EP_FR_PENDING | EP_FR_EMITTED)))
		return 0;
	uint64_t now = ep_ticks();
	if (f & EP_FR_EMITTED) {
		ep_trace_ts(th, EP_EV_EXIT, key, ep_ticks_mono(now), gen);
		return 1;
	}
	if (now <= fr->ts || ep_to_ns(now - fr->ts) < LOAD(&ep.hdr->filter_min_ns))
		return 0;
	/* The pending callers: down the stack over pending frames and over
	 * frames a quota skipped (D31: they record nothing, so a pending caller
	 * below one is still this call's caller in the stream); the walk stops
	 * at the first frame that is neither (written already, or not judged). */
	uint32_t j = depth;
	for (uint32_t i = depth; i > 0; i--) {
		const struct ep_frame *c = &frs[i - 1];
		if (c->flags == (ep_ | EP_FR_PENDING))
			j = i - 1;
		else if (!ep_frame_skip(c))
			break;
	}
	for (uint32_t i = j; i < depth; i++) {
		if (frs[i].flags != (ep_ | EP_FR_PENDING))
			continue; /* a skipped frame between pending ones */
		ep_trace_ts(th, EP_EV_ENTER, frs[i].fn, ep_ticks_mono(frs[i].ts), gen);
		frs[i].flags = ep_ | EP_FR_EMITTED;
	}
	ep_trace_ts(th, EP_EV_ENTER, key, ep_ticks_mono(fr->ts), gen);
	ep_trace_ts(th, EP_EV_EXIT, key, ep_ticks_mono(now), gen);
	return 1;
}

/* ---- thread exit ---- */

EP_SHARED void ep_thread_dtor(void *v) {
	struct ep_thread *th = v;
	if ((uintptr_t)th < EP_SLOT_MIN || th != ep_tls.slot)
		return;
	ep_tls.busy = EP_BUSY_HARD;
	SIGFENCE();
	ep_pop_to(th, 0);
	ep_tls.slot = EP_TS_DEAD;
	/* Hijacked frames cannot outlive this: the thread function has returned
	 * or been unwound (pthread_exit, cancellation) before key destructors. */
	ep_rs_free();
	ADD(&ep.hdr->threads_active, (uint64_t)-1);
	__atomic_store_n(&th->state, EP_SLOT_FREE, __ATOMIC_RELEASE);
	SIGFENCE();
	ep_tls.busy = 0;
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
