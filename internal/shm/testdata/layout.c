/* layout.c: prints "struct.field offset size" for every field of the region
 * layout in runtime/edgeprobe_shm.h; TestLayoutMatchesC compares the output
 * with the Go mirror in layout.go. */
#include <stddef.h>
#include <stdio.h>
#include "edgeprobe_shm.h"

#define F(s, f) printf(#s "." #f " %zu %zu\n", offsetof(struct s, f), sizeof(((struct s *)0)->f))
#define S(s) printf(#s " %zu\n", sizeof(struct s))
#define C(c) printf("const." #c " %llu\n", (unsigned long long)(c))

int main(void) {
	S(ep_header); S(ep_func); S(ep_thread); S(ep_local); S(ep_frame); S(ep_event);
	C(EP_MAGIC); C(EP_VERSION); C(EP_HEADER_SIZE); C(EP_HIST_BUCKETS); C(EP_KEY_BARE);
	C(EP_CLOCK_TSC); C(EP_CLOCK_MONO); C(EP_STATE_RUNNING); C(EP_STATE_EXITED);
	C(EP_CTL_TRACE); C(EP_CTL_NOTIME); C(EP_CTL_PAUSE); C(EP_CTL_QUOTA); C(EP_CTL_FILTER); C(EP_FILTER_TIDS); C(EP_SLOT_OWNED);
	C(EP_FENTRY_USED); C(EP_FENTRY_EXITS); C(EP_FENTRY_EXITS_OFF); C(EP_FENTRY_SHSTK);
	C(EP_EV_ENTER); C(EP_EV_EXIT); C(EP_EV_THREAD); C(EP_EV_DATA); C(EP_CTL_ARGS);
	C(EP_DATA_ARGS); C(EP_DATA_RET); C(EP_DATA_GEN); C(EP_DATA_SUB_SHIFT); C(EP_DATA_SLOTS_SHIFT); C(EP_DATA_SPEC_MASK);
	C(EP_STR_MAX); C(EP_STACK_MAX); C(EP_STR_COMPLETE); C(EP_STR_FAULT); C(EP_ARGPLANS);
	C(EP_PLAN_ENTRY); C(EP_PLAN_EXIT); C(EP_PLAN_RSTR);
	/* the spec accessors on a spec with every field set (Go: layoutSpec) */
	printf("const.SPEC_INT %u\nconst.SPEC_SSE %u\nconst.SPEC_STR %u\nconst.SPEC_STACK %u\nconst.SPEC_RINT %u\nconst.SPEC_RSSE %u\n",
	       EP_PLAN_INT(0x0f2a15a5c3e7ull), EP_PLAN_SSE(0x0f2a15a5c3e7ull), EP_PLAN_STR(0x0f2a15a5c3e7ull),
	       EP_PLAN_STACK(0x0f2a15a5c3e7ull), EP_PLAN_RINT(0x0f2a15a5c3e7ull), EP_PLAN_RSSE(0x0f2a15a5c3e7ull)); C(EP_EV_KIND_SHIFT); C(EP_EV_TS_MASK);
	C(EP_HASH_MUL); C(EP_HASH_STEP);
	F(ep_header, magic); F(ep_header, version); F(ep_header, header_size); F(ep_header, region_size);
	F(ep_header, pid); F(ep_header, ppid); F(ep_header, hist_buckets); F(ep_header, clock_kind);
	F(ep_header, tsc_mult); F(ep_header, tsc0); F(ep_header, mono0); F(ep_header, real0);
	F(ep_header, func_off); F(ep_header, max_funcs); F(ep_header, func_size); F(ep_header, thread_off);
	F(ep_header, max_threads); F(ep_header, thread_size); F(ep_header, thread_local_off);
	F(ep_header, local_funcs); F(ep_header, local_size); F(ep_header, thread_stack_off);
	F(ep_header, stack_depth); F(ep_header, frame_size); F(ep_header, ring_off); F(ep_header, ring_stride);
	F(ep_header, ring_events); F(ep_header, event_size); F(ep_header, max_probe); F(ep_header, func_first); F(ep_header, calib_ns);
	F(ep_header, maps_off); F(ep_header, maps_len); F(ep_header, init_mono); F(ep_header, state);
	F(ep_header, exit_mono); F(ep_header, exit_tsc);
	F(ep_header, keys_off); F(ep_header, func_segs); F(ep_header, control);
	F(ep_header, gen); F(ep_header, quota_k); F(ep_header, quota_epoch); F(ep_header, filter_depth); F(ep_header, filter_tid); F(ep_header, filter_min_ns); F(ep_header, filter_epoch); F(ep_header, qtrace_lo); F(ep_header, qtrace_hi);
	F(ep_header, ring_req); F(ep_header, ring_def); F(ep_thread, ring_size); F(ep_header, funcs_used);
	F(ep_header, func_drop_enters); F(ep_header, func_drop_exits); F(ep_header, threads_claimed);
	F(ep_header, threads_active); F(ep_header, thread_overflows); F(ep_header, thread_drop_hits);
	F(ep_header, preinit_drops); F(ep_header, late_drops); F(ep_header, fentry_mode);
	F(ep_header, fentry_sites); F(ep_header, fentry_bad_sites); F(ep_header, fentry_unwound); F(ep_header, nosys); F(ep_header, nosys_threads); F(ep_header, nosys_skips); F(ep_header, inflight); F(ep_header, inflight_max);
	F(ep_header, argplan); F(ep_argplan, key); F(ep_argplan, spec); S(ep_argplan);
	F(ep_func, addr); F(ep_func, entries); F(ep_func, exits); F(ep_func, sum_ns); F(ep_func, min_inv);
	F(ep_func, max_ns); F(ep_func, orphans); F(ep_func, unmatched); F(ep_func, hist);
	F(ep_func, deep_entries); F(ep_func, deep_exits); F(ep_func, gen); F(ep_func, quota);
	F(ep_thread, state); F(ep_thread, tid); F(ep_thread, generation); F(ep_thread, depth);
	F(ep_thread, claimed_mono); F(ep_thread, reentrant_drops); F(ep_thread, stack_overflows);
	F(ep_thread, orphans); F(ep_thread, unmatched); F(ep_thread, local_full); F(ep_thread, ring_head);
	F(ep_thread, ring_dropped); F(ep_thread, ring_tail_cache); F(ep_thread, index); F(ep_thread, quota_busy); F(ep_thread, ring_tail);
	F(ep_thread, deep_lost); F(ep_thread, abandoned_hooks); F(ep_thread, fentry_restored); F(ep_thread, quota_skips);
	F(ep_thread, sample_left); F(ep_thread, ev_gen); F(ep_thread, hook_ticks); F(ep_thread, hook_samples);
	F(ep_thread, filter_out_cg); F(ep_thread, filter_lim_cg); F(ep_thread, filter_lim);
	F(ep_local, addr); F(ep_local, gidx); F(ep_local, hint); F(ep_local, entries); F(ep_local, exits); F(ep_local, sum_ns); F(ep_local, frame_ids); F(ep_local, parked);
	F(ep_frame, fn); F(ep_frame, ts); F(ep_frame, sp); F(ep_frame, site); F(ep_frame, gidx); F(ep_frame, loff); F(ep_frame, gen); F(ep_frame, flags);
	F(ep_event, tsk); F(ep_event, fn);
	S(ep_inflight_site); F(ep_inflight_site, addr); F(ep_inflight_site, len); F(ep_inflight_site, active); F(ep_inflight_site, inert);
	F(ep_inflight, count); F(ep_inflight, lock); F(ep_inflight, traps); F(ep_inflight, repairs); F(ep_inflight, holds); F(ep_inflight, site);
	C(EP_INFLIGHT_MAX); C(EP_SITE_MAX);
	return 0;
}
