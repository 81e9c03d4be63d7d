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

/* What a cyg hook does once it may record. */
enum { EP_HOOK_ENTER, EP_HOOK_EXIT, EP_HOOK_COUNT };

/* Control bits that send every hook to the general path (quotas: enters
 * must take one, and the hooks are sampled for the profiler's estimate). */
#define EP_CTL_SLOWPATH (EP_CTL_PAUSE | EP_CTL_TRACE | EP_CTL_QUOTA)

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

/* The body of the enter and exit hooks (D29): the common case with no call
 * at all, so that the hook needs no callee-saved register and no stack
 * frame beyond the frame pointer; everything else starts over in
 * ep_cyg_slow. The busy word is set before the fast path reads any
 * per-thread state, as on every path (a signal handler's hooks see it). */
EP_INLINE void ep_cyg_hook(uint64_t key, int what, uint64_t here) {
	struct ep_thread *th = ep_tls.slot;
	if (likely((uintptr_t)th >= EP_SLOT_MIN && !ep_tls.busy)) {
		uint32_t ctl = LOAD(&ep.hdr->control), gen = ep_gen_now(); /* one cache line */
		if (likely(!(ctl & EP_CTL_SLOWPATH))) {
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

EP_EXPORT void __cyg_profile_func_enter(void *fn, void *site) {
	(void)site;
	ep_cyg_hook((uint64_t)(uintptr_t)fn, EP_HOOK_ENTER, EP_HERE());
}

EP_EXPORT void __cyg_profile_func_exit(void *fn, void *site) {
	(void)site;
	ep_cyg_hook((uint64_t)(uintptr_t)fn, EP_HOOK_EXIT, EP_HERE());
}

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
