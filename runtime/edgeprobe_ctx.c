/* edgeprobe_ctx.c: a context switched with swapcontext takes its probes'
 * state with it (D102; docs/runtime.md "Coroutines").
 *
 * Stackful coroutines switch stacks under the hooks. Left alone, the frames
 * a suspended coroutine pushed stay on the thread's shadow stack and (with
 * fentry exits) return-address stack, where the next coroutine's hooks take
 * them for its own (cyg latencies swapped between coroutines, F5) or judge
 * them dead, and a coroutine resumed on another thread returns through a
 * hijacked slot whose entry is on the first thread (SIGILL, F6).
 *
 * swapcontext is defined here (default visibility, weak, as prctl in
 * edgeprobe_seccomp.c), so a preloaded runtime comes before libc. Before
 * switching it moves the running context's part of both stacks (what was
 * pushed since it last resumed: ep_tls.ctx_d_base, ctx_rs_base) into a
 * record allocated in its own frame, on the stack being switched out; the
 * real swapcontext saves the context inside this function, so when it is
 * resumed, on whatever thread, it continues here and puts the record on
 * the resuming thread's stacks. Ownership rides on the program's own
 * hand-off: the record is written by the thread that suspends the context
 * before the switch and read by the one that resumes it after, and the
 * program must order those two (they are the same ucontext_t's save and
 * load). No thread ever reads or writes another thread's stacks, and no
 * shared table or lock is involved.
 *
 * Frames in the record are on no thread's shadow stack, where readers count
 * a function's open calls: each is counted in the `parked` field of its
 * cache entry (ep_local, on the thread that pushed it) while suspended, and
 * readers add those to `open`: the balance holds at every moment, and a
 * context never resumed shows its calls open. A frame with no cache entry
 * (the thread's cache full) cannot be counted so: its context parks
 * nothing (as when too deep).
 *
 * Not covered (docs/runtime.md): switchers that do not call libc's
 * swapcontext (boost.context's own assembly, setcontext, getcontext
 * resumed later), and a runtime loaded into a running process by dlopen
 * (it comes after libc in lookup order).
 */
#include "edgeprobe_internal.h"

#include <ucontext.h>

struct ep_park {
	uint32_t nrs;         /* return-stack entries after the header (EP_RS_ENTRY each) */
	uint32_t nfr;         /* shadow frames after them */
	uint32_t epoch;       /* ep_epoch when parked: a fork child's region is another */
	int32_t tid;          /* the thread that parked them, with its slot: */
	struct ep_thread *th; /* per-thread fields (loff, flags) stay valid on it only */
};

typedef int (*ep_swap_fn)(ucontext_t *, const ucontext_t *);

#ifdef EP_ARCHIVE
/* A static program: libc.a's own, under its internal name (swapcontext is
 * its weak alias); the reference pulls it in. */
extern int __swapcontext(ucontext_t *, const ucontext_t *);
EP_STATIC ep_swap_fn ep_swap_real(void) { return __swapcontext; }
#else
static ep_swap_fn ep_swap_fn_cached;

EP_STATIC ep_swap_fn ep_swap_real(void) {
	ep_swap_fn fn = __atomic_load_n(&ep_swap_fn_cached, __ATOMIC_ACQUIRE);
	if (!fn) {
		void *sym = dlsym(RTLD_NEXT, "swapcontext");
		memcpy(&fn, &sym, sizeof fn);
		__atomic_store_n(&ep_swap_fn_cached, fn, __ATOMIC_RELEASE);
	}
	return fn;
}

/* Looked up at load time, so that a first swapcontext in a signal handler
 * does not call dlsym. */
__attribute__((constructor, no_instrument_function)) static void ep_ctx_init(void) { (void)ep_swap_real(); }
#endif

/* Where the running context's shadow frames begin, and how many it has
 * (0 when they cannot move: deeper than the stored frames). */
EP_STATIC uint32_t ep_ctx_frames(struct ep_thread *th, uint32_t *base) {
	uint32_t depth = th->depth, b = ep_tls.ctx_d_base;
	if (b > depth)
		b = depth;
	*base = b;
	return depth <= ep.stack_depth ? depth - b : 0;
}

/* The largest record: it is allocated on the coroutine's stack, which may
 * be small (16 KiB). A context with more to park (over 50 probed frames
 * deep with fentry exits, 85 without) parks nothing: its fentry entries are
 * given up in place (their frames return normally, unmeasured) and its
 * shadow frames are counted unmatched (their cyg exits are orphans). */
#define EP_PARK_MAX 4096u

EP_STATIC size_t ep_park_bytes(uint32_t nrs, uint32_t nfr) {
	return sizeof(struct ep_park) + (size_t)nrs * EP_RS_ENTRY + (size_t)nfr * sizeof(struct ep_frame);
}

/* The size of the running context's record; 0: nothing to park. */
__attribute__((noinline, no_instrument_function)) static size_t ep_ctx_need(void) {
	if (__atomic_load_n(&ep_state, __ATOMIC_ACQUIRE) != 2)
		return 0;
	uint32_t nrs = ep_rs_ctx_count(), nfr = 0, b;
	struct ep_thread *th = ep_tls.slot;
	if ((uintptr_t)th >= EP_SLOT_MIN)
		nfr = ep_ctx_frames(th, &b);
	if (!nrs && !nfr)
		return 0;
	size_t bytes = ep_park_bytes(nrs, nfr);
	return bytes <= EP_PARK_MAX ? bytes : sizeof(struct ep_park);
}

/* Move the running context's frames and entries into pk (bytes long).
 * Parks nothing when this thread is inside a hook (a signal handler that
 * interrupted one switches contexts: its entries stay, as without the
 * interposer). When they do not fit (over EP_PARK_MAX, or a handler ran
 * hooks between the sizing and now) the entries are given up in place and
 * the frames counted unmatched. */
__attribute__((noinline, no_instrument_function)) static void ep_ctx_park(struct ep_park *pk, size_t bytes) {
	uint64_t here = EP_HERE();
	pk->nrs = pk->nfr = 0;
	pk->epoch = ep_epoch;
	pk->th = NULL;
	pk->tid = 0;
	struct ep_thread *th = ep_tls.slot;
	int slot = (uintptr_t)th >= EP_SLOT_MIN;
	if (ep_tls.busy && ep_busy_live(slot ? th : NULL, here))
		return;
	ep_tls.busy_ret = (uint64_t)(uintptr_t)__builtin_return_address(0);
	SIGFENCE();
	ep_tls.busy = here;
	SIGFENCE();
	uint32_t nrs = ep_rs_ctx_count(), nfr = 0, b = 0;
	if (slot)
		nfr = ep_ctx_frames(th, &b);
	int fits = ep_park_bytes(nrs, nfr) <= bytes;
	for (uint32_t i = 0; fits && i < nfr; i++) {
		const struct ep_frame *fr = ep_frames(th) + b + i;
		if (!ep_frame_skip(fr) && !fr->loff)
			fits = 0; /* no cache entry to count it parked in (cache full) */
	}
	if (fits) {
		char *p = (char *)(pk + 1);
		nrs = ep_rs_ctx_park(p, nrs, b, b + nfr);
		if (nfr) {
			struct ep_frame *to = (struct ep_frame *)(void *)(p + (size_t)nrs * EP_RS_ENTRY);
			const struct ep_frame *from = ep_frames(th) + b;
			for (uint32_t i = 0; i < nfr; i++) {
				to[i] = from[i];
				/* on no thread's stack now: open through the count */
				if (!ep_frame_skip(&to[i]))
					ADD(&ep_local_at(th, to[i].loff)->parked, 1);
			}
			SIGFENCE();
			STORE(&th->depth, b);
			pk->th = th;
			pk->tid = th->tid;
		}
		pk->nrs = nrs;
		pk->nfr = nfr;
		ep_tls.ctx_d_base = b;
	} else {
		/* too deep to park: the calls in progress lose their latencies,
		 * counted unmatched now rather than left for the next context */
		ep_rs_ctx_giveup(slot ? th : NULL);
		if (slot) {
			ep_pop_to(th, b);
			ep_tls.ctx_d_base = b;
		}
	}
	SIGFENCE();
	ep_tls.busy = 0;
}

/* The parked frames of pk leave the parked count of their cache entries
 * on the thread that parked them (atomic: that thread may be counting other
 * frames of the same function meanwhile). Then, unless they are put on a
 * stack again (put), they are counted unmatched, as frames healed away. */
EP_STATIC void ep_ctx_unpark_count(const struct ep_park *pk, const struct ep_frame *fr, struct ep_thread *th, int put, int own) {
	for (uint32_t i = 0; i < pk->nfr; i++) {
		if (ep_frame_skip(&fr[i]))
			continue;
		ADD(&ep_local_at(pk->th, fr[i].loff)->parked, (uint64_t)-1);
		if (!put) {
			ADD(&ep.funcs[fr[i].gidx].unmatched, 1);
			if (own)
				OWN_ADD(&th->unmatched, 1);
		}
	}
}

/* The context of pk resumed on this thread (perhaps not the one that
 * parked it): put its frames and entries on this thread's stacks. */
__attribute__((noinline, no_instrument_function)) static void ep_ctx_unpark(struct ep_park *pk) {
	if (!pk->nrs && !pk->nfr)
		return;
	/* Taken: a second resume of the same saved state (a copy of the
	 * ucontext_t resumed twice) finds nothing to put back twice. */
	char *p = (char *)(pk + 1); /* the entries, then the frames */
	struct ep_park rec = *pk;
	pk->nrs = pk->nfr = 0;
	pk = &rec;
	int saved_errno = errno; /* the slot claim and the return stack's mmap: libc */
	uint64_t here = EP_HERE();
	const struct ep_frame *from = (const struct ep_frame *)(const void *)(p + (size_t)pk->nrs * EP_RS_ENTRY);
	if (pk->epoch != ep_epoch)
		pk->nfr = 0; /* resumed in a fork child: the frames and the counts the
		              * record names are the parent's region's, never the
		              * child's (its entries are orphans: ep_fentry_record_exit) */
	struct ep_thread *th = ep_tls.slot;
	if (th == EP_TS_NONE)
		th = ep_claim();
	int slot = (uintptr_t)th >= EP_SLOT_MIN;
	if (ep_tls.busy && ep_busy_live(slot ? th : NULL, here)) {
		/* inside a hook of this thread: give the slots back, touch nothing
		 * of this thread's (the frames counted unmatched) */
		ep_ctx_unpark_count(pk, from, th, 0, 0);
		ep_rs_ctx_unpark(th, p, pk->nrs, 0, 0);
		errno = saved_errno;
		return;
	}
	ep_tls.busy_ret = (uint64_t)(uintptr_t)__builtin_return_address(0);
	SIGFENCE();
	ep_tls.busy = here;
	SIGFENCE();
	int mode = 2;
	uint32_t dbase = 0;
	if (slot) {
		uint32_t depth = th->depth;
		dbase = depth;
		if (pk->nfr && depth <= ep.stack_depth && pk->nfr <= ep.stack_depth - depth) {
			int same = th == pk->th && th->tid == pk->tid;
			struct ep_frame *to = ep_frames(th) + depth;
			ep_ctx_unpark_count(pk, from, th, 1, 1);
			for (uint32_t i = 0; i < pk->nfr; i++) {
				to[i] = from[i];
				if (!same && !ep_frame_skip(&to[i])) {
					/* its exit counts in this thread's cache entry (or
					 * the shared counters); trace filter state is per
					 * thread */
					uint32_t g;
					struct ep_local *l = ep_lookup(th, to[i].fn, &g);
					to[i].loff = l ? (uint32_t)((char *)l - (char *)th) : 0;
					to[i].flags = 0;
				}
			}
			SIGFENCE();
			STORE(&th->depth, depth + pk->nfr);
			mode = 1;
		} else {
			ep_ctx_unpark_count(pk, from, th, 0, 1);
		}
		ep_tls.ctx_d_base = dbase;
	} else {
		ep_ctx_unpark_count(pk, from, th, 0, 0);
	}
	if (pk->nrs)
		ep_rs_ctx_unpark(th, p, pk->nrs, dbase, mode);
	else
		ep_tls.ctx_rs_base = ep_tls.rs_n; /* no entries came: this context's begin here */
	SIGFENCE();
	ep_tls.busy = 0;
	errno = saved_errno;
}

/* libc's swapcontext, with the running context's probe state parked on its
 * own stack across the switch. The record is allocated in this frame: the
 * context is suspended inside the real swapcontext called from here, so the
 * frame, and the record in it, stay as they are until the context resumes,
 * on any thread. This function itself touches no thread-local state: after
 * the switch it may run on another thread, and a thread-pointer value kept
 * in a register would be the first thread's (the helpers read it anew). */
__attribute__((visibility("default"), weak, noinline, no_instrument_function)) int swapcontext(ucontext_t *oucp,
                                                                                                const ucontext_t *ucp) {
	ep_swap_fn real = ep_swap_real();
	if (!real) {
		errno = ENOSYS;
		return -1;
	}
	size_t need = ep_ctx_need();
	struct ep_park *pk = NULL;
	if (need) {
		pk = __builtin_alloca(need);
		ep_ctx_park(pk, need);
	}
	int r = real(oucp, ucp);
	if (pk)
		ep_ctx_unpark(pk);
	return r;
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
