/* edgeprobe_cyg.c: the -finstrument-functions hooks.
 *
 * Owns __cyg_profile_func_enter / _exit (gcc and clang) and clang's
 * __cyg_profile_func_enter_bare: each claims the thread's slot on its first
 * hit, sets the busy word (its frame address and return address), records
 * through the shadow stack (edgeprobe_internal.h) and clears the word.
 *
 * Locking: none; async-signal-safe: a hook that finds the busy word of a live
 * hook on its thread is dropped and counted (reentrant_drops); a stale word
 * is cleared and counted (ep_busy_live).
 */
#include "edgeprobe_internal.h"
#include "edgeprobe_asm.h"

/* What a cyg hook does once it may record. */
enum { EP_HOOK_ENTER, EP_HOOK_EXIT, EP_HOOK_COUNT };

/* The general body of every cyg hook: first hook of a thread, a busy word
 * set, paused, tracing, no TSC, and whatever ep_enter_fast / ep_exit_fast
 * decline. here is the exported hook's frame address, ret its return
 * address (the busy word names the exported hook, whose return address stays
 * at here + 8 while we run, called or tail-called). */
__attribute__((noinline, no_instrument_function)) static void ep_cyg_slow(uint64_t key, int what, uint64_t here) {
	uint64_t ret = *(volatile uint64_t *)(uintptr_t)(here + 8);
	struct ep_thread *th = ep_tls.slot;
	if (unlikely((uintptr_t)th < EP_SLOT_MIN) && !(th = ep_claim()))
		return;
	if (unlikely(ep_tls.busy) && ep_busy_live(th, here)) {
		OWN_ADD(&th->reentrant_drops, 1);
		return;
	}
	uint32_t ctl = LOAD(&ep.hdr->control);
	if (unlikely(ctl & EP_CTL_PAUSE))
		return;
	ep_tls.busy_ret = ret;
	SIGFENCE();
	ep_tls.busy = here;
	SIGFENCE();
	uint64_t t0 = ep_sample_start(th, ctl);
	if (what == EP_HOOK_EXIT)
		ep_exit(th, key, ctl, here);
	else if (what == EP_HOOK_ENTER)
		ep_enter(th, key, ctl, here, ret, 1);
	else
		ep_count_entry(th, key, ctl, 0);
	ep_sample_end(th, t0);
	SIGFENCE();
	ep_tls.busy = 0;
}

/* Whether the trace filters leave this hook's event out (D32), the only
 * reason the control word sends it to the general path: then the hook takes
 * the fast path as an untraced one, and a filtered-out call costs about
 * what a counted one does. The call's depth: its frame's index (an exit's
 * frame is the top one). Read before the busy word is set: a signal handler
 * landing in between runs its hooks to their end and leaves the depth as it
 * found it, or never returns here. */
EP_INLINE int ep_untraced(struct ep_thread *th, uint64_t cg, int exit) {
	uint32_t ctl = (uint32_t)cg;
	if ((ctl & (EP_CTL_SLOWPATH | EP_CTL_FILTER)) != (EP_CTL_TRACE | EP_CTL_FILTER))
		return 0;
	return ep_filter_out(th, cg, th->depth - (uint32_t)exit);
}

/* The body of the enter and exit hooks (D29): the common case with no call
 * at all, so that the hook needs no callee-saved register and no stack
 * frame beyond the frame pointer; everything else starts over in
 * ep_cyg_slow. The busy word is set before the fast path reads any
 * per-thread state, as on every path (a signal handler's hooks see it). */
EP_INLINE void ep_cyg_hook(uint64_t key, int what, uint64_t here) {
	struct ep_thread *th = ep_tls.slot;
	if (likely((uintptr_t)th >= EP_SLOT_MIN && !ep_tls.busy)) {
		uint64_t cg = ep_ctl_gen();
		uint32_t ctl = (uint32_t)cg, gen = (uint32_t)(cg >> 32);
		if (likely(!(ctl & EP_CTL_SLOWPATH)) || ep_untraced(th, cg, what == EP_HOOK_EXIT)) {
			uint64_t ret = *(volatile uint64_t *)(uintptr_t)(here + 8);
			ep_tls.busy_ret = ret;
			SIGFENCE();
			ep_tls.busy = here;
			SIGFENCE();
			int done = what == EP_HOOK_EXIT ? ep_exit_fast(th, key, ctl, gen)
			                                : ep_enter_fast(th, key, ctl, gen, here, ret);
			SIGFENCE();
			ep_tls.busy = 0;
			if (likely(done))
				return;
		}
	}
	ep_cyg_slow(key, what, here);
}

/* The exported hooks are in edgeprobe_cyg.S (D33): their common case in
 * assembly, everything else here. They jump to these with the stack and the
 * arguments as the instrumented function left them, so EP_HERE() is the
 * exported hook's own frame address. */
EP_SHARED void ep_cyg_enter_full(void *fn, void *site) {
	(void)site;
	ep_cyg_hook((uint64_t)(uintptr_t)fn, EP_HOOK_ENTER, EP_HERE());
}

EP_SHARED void ep_cyg_exit_full(void *fn, void *site) {
	(void)site;
	ep_cyg_hook((uint64_t)(uintptr_t)fn, EP_HOOK_EXIT, EP_HERE());
}

/* The assembly exit's last step when a latency is a new minimum or maximum
 * of its function (a CAS loop): then the busy word is cleared here. */
EP_SHARED void ep_cyg_minmax_tail(struct ep_func *f, uint64_t ns) {
	ep_record_minmax(f, ns);
	SIGFENCE();
	ep_tls.busy = 0;
}

/* edgeprobe_asm.h's constants are the C layout's (edgeprobe_cyg.S uses them). */
#define EPA_CHECK(c, what) _Static_assert(c, "edgeprobe_asm.h: " what)
EPA_CHECK(offsetof(struct ep_tls, slot) == EPA_TLS_SLOT && offsetof(struct ep_tls, busy) == EPA_TLS_BUSY &&
              offsetof(struct ep_tls, busy_ret) == EPA_TLS_BUSY_RET && offsetof(struct ep_tls, frames) == EPA_TLS_FRAMES,
          "ep_tls");
EPA_CHECK(offsetof(struct ep_proc, hdr) == EPA_PROC_HDR && offsetof(struct ep_proc, funcs) == EPA_PROC_FUNCS &&
              offsetof(struct ep_proc, tsc_mult) == EPA_PROC_TSC_MULT &&
              offsetof(struct ep_proc, lmask) == EPA_PROC_LMASK &&
              offsetof(struct ep_proc, lmask_off) == EPA_PROC_LMASK_OFF &&
              offsetof(struct ep_proc, fast_depth) == EPA_PROC_FAST_DEPTH &&
              offsetof(struct ep_proc, stack_off) == EPA_PROC_STACK_OFF,
          "ep_proc");
EPA_CHECK(offsetof(struct ep_header, control) == EPA_HDR_CONTROL &&
              offsetof(struct ep_header, filter_depth) == EPA_HDR_FILTER_DEPTH &&
              offsetof(struct ep_header, filter_tid) == EPA_HDR_FILTER_TID && EP_FILTER_TIDS == EPA_FILTER_TIDS &&
              EPA_HDR_FILTER_TID == EPA_HDR_FILTER_DEPTH + 4 && EPA_HDR_FILTER_DEPTH % 8 == 0,
          "ep_header");
EPA_CHECK(offsetof(struct ep_thread, tid) == EPA_TH_TID && offsetof(struct ep_thread, filter_out_cg) == EPA_TH_FILTER_OUT_CG &&
              offsetof(struct ep_thread, filter_lim_cg) == EPA_TH_FILTER_LIM_CG &&
              offsetof(struct ep_thread, filter_lim) == EPA_TH_FILTER_LIM && offsetof(struct ep_thread, depth) == EPA_TH_DEPTH &&
              sizeof(struct ep_thread) == EPA_TH_SIZE,
          "ep_thread");
EPA_CHECK(sizeof(struct ep_local) == EPA_LOCAL_SIZE && offsetof(struct ep_local, addr) == EPA_LOCAL_ADDR &&
              offsetof(struct ep_local, gidx) == EPA_LOCAL_GIDX && offsetof(struct ep_local, hint) == EPA_LOCAL_HINT &&
              offsetof(struct ep_local, entries) == EPA_LOCAL_ENTRIES &&
              offsetof(struct ep_local, exits) == EPA_LOCAL_EXITS &&
              offsetof(struct ep_local, sum_ns) == EPA_LOCAL_SUM_NS &&
              offsetof(struct ep_local, frame_ids) == EPA_LOCAL_FRAME_IDS &&
              offsetof(struct ep_frame, loff) == offsetof(struct ep_frame, gidx) + 4 &&
              EPA_LOCAL_SIZE == 64 /* the hooks make its offset with one mask (D98) */,
          "ep_local");
EPA_CHECK(sizeof(struct ep_frame) == EPA_FR_SIZE && offsetof(struct ep_frame, fn) == EPA_FR_FN &&
              offsetof(struct ep_frame, ts) == EPA_FR_TS && offsetof(struct ep_frame, sp) == EPA_FR_SP &&
              offsetof(struct ep_frame, site) == EPA_FR_SITE && offsetof(struct ep_frame, gidx) == EPA_FR_GIDX &&
              offsetof(struct ep_frame, loff) == EPA_FR_LOFF && offsetof(struct ep_frame, gen) == EPA_FR_GEN,
          "ep_frame");
EPA_CHECK(sizeof(struct ep_func) == EPA_FUNC_SIZE && offsetof(struct ep_func, min_inv) == EPA_FUNC_MIN_INV &&
              offsetof(struct ep_func, max_ns) == EPA_FUNC_MAX_NS && offsetof(struct ep_func, hist) == EPA_FUNC_HIST,
          "ep_func");
EPA_CHECK(EPA_SLOT_MIN == EP_SLOT_MIN && EPA_CTL_SLOWPATH == EP_CTL_SLOWPATH && EPA_CTL_NOTIME == EP_CTL_NOTIME &&
              EPA_CTL_TRACE == EP_CTL_TRACE && EPA_CTL_FILTER == EP_CTL_FILTER &&
              EPA_HIST_LAST == EP_HIST_BUCKETS - 1,
          "constants");
EPA_CHECK((EP_CTL_SLOWPATH & ~0xffu) == 0 && (EP_CTL_NOTIME & ~0xffu) == 0, "control bits tested as a byte");

/* clang -finstrument-function-entry-bare: no address and no exit. Counted as
 * an entry keyed by the return address (inside the instrumented function)
 * with EP_KEY_BARE set; the reader resolves it by containment. */
EP_EXPORT void __cyg_profile_func_enter_bare(void) {
	uint64_t ret = (uint64_t)(uintptr_t)__builtin_return_address(0);
	ep_cyg_slow(ret | EP_KEY_BARE, EP_HOOK_COUNT, EP_HERE());
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
