/* edgeprobe_fentry.c: the C side of the fentry provider.
 *
 * Owns ep_fentry_enter / _slow (called by __fentry__ in edgeprobe_fentry.S),
 * ep_fentry_exit / _slow (called by the return trampoline ep_fentry_return),
 * the site table (return address of a __fentry__ call -> function key), the
 * per-thread return-address stack of hijacked frames and its healing, the
 * vector-save size for the assembly's slow paths, and the unwinder
 * personality that restores hijacked return addresses during unwinding.
 *
 * Locking: none. The site table is shared (insert by CAS, key published
 * with release order); the return-address stack is the thread's own. The
 * fast paths run with only the argument (or return-value) registers saved:
 * no libc, general registers only; the _slow entries run behind a full
 * xsave and may call libc (slot claim, mmap of the return-address stack).
 */
#include "edgeprobe_internal.h"

/* ---- fentry provider (-pg -mfentry) ----
 *
 * __fentry__ (edgeprobe_fentry.S) saves the argument registers and calls
 * ep_fentry_enter with the return address into the probed function and the
 * address of that function's own return slot. Entries are keyed, like cyg
 * probes, by the function's start address, found from the call's return
 * address by a per-site table (built at a site's first hit by decoding the
 * call: e8 rel32 or ff 15 rel32, optionally after endbr64).
 *
 * Exits (unless off) the LOPI way: the slot's return address is saved on a
 * per-thread return-address stack (a private mapping, pointer in TLS, so fork
 * copies it) together with the slot address, and replaced by ep_fentry_return.
 * The trampoline finds its frame by slot address (rsp - 8 when it runs),
 * records the exit into the same shadow stack / counters / histogram / ring
 * as a cyg exit, and returns to the saved address; it never looks at the
 * site, so a probe switched off meanwhile still returns correctly.
 *
 * Frames that die without returning (longjmp, exceptions, pthread_exit, a
 * signal handler longjmping out) leave dead entries on the stack. They are
 * dropped, and their shadow frames counted unmatched, when a frame below them
 * returns, and when a new entry finds frames at or below its own slot (the
 * stack has been popped past them). The unwinder walks through hijacked
 * frames via the trampoline's FDE and ep_fentry_personality. */

#define EP_RS_UNSET 0u
#define EP_RS_ON 1u
#define EP_RS_OFF 2u
#define EP_SITES 16384u /* power of two */
/* Site-table key flag (never in a recorded key): the call is wrapped in
 * push %r10 / pop %r10 (gcc, functions with a static chain), so the return
 * slot is 8 bytes further up. User-space addresses leave bit 62 free. */
#define EP_SITE_R10 (1ull << 62)
#define EP_SITE_PROBES 8u

struct ep_rframe {
	uint64_t slot;  /* address of the hijacked return slot */
	uint64_t ret;   /* the original return address */
	uint64_t key;   /* function key */
	uint32_t d;     /* shadow-stack depth of the function's frame */
	uint32_t epoch; /* ep_epoch when pushed */
};

/* Site table: return address of the __fentry__ call -> function key. */
struct ep_site {
	uint64_t ret;
	uint64_t key;
};
static struct ep_site ep_sites[EP_SITES] __attribute__((aligned(64)));

extern char ep_fentry_return[] __attribute__((visibility("hidden")));
#define EP_TRAMP ((uint64_t)(uintptr_t)ep_fentry_return)

/* xsave area for the slow paths (read by edgeprobe_fentry.S). */
__attribute__((visibility("hidden"))) uint32_t ep_vsave_size;
__attribute__((visibility("hidden"))) uint32_t ep_vsave_xsave;

/* Size of the (f)xsave area for components 0xe7 (x87, SSE, AVX, opmask,
 * ZMM_Hi256, Hi16_ZMM), a multiple of 64. No libc: called from assembly with
 * only xmm0-7 saved. */
__attribute__((visibility("hidden"), no_instrument_function)) uint32_t ep_vsave_init(void) {
	unsigned a, b, c, d;
	uint32_t size = 512, xs = 0;
	if (__get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 27))) { /* OSXSAVE */
		uint32_t lo, hi;
		__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
		(void)hi;
		xs = 1;
		size = 576;
		for (unsigned i = 2; i < 8; i++) {
			if (!((0xe7u >> i) & 1) || !((lo >> i) & 1))
				continue;
			__cpuid_count(0xd, i, a, b, c, d);
			if (b + a > size)
				size = b + a;
		}
	}
	size = (size + 63) & ~63u;
	STORE(&ep_vsave_xsave, xs);
	STORE(&ep_vsave_size, size);
	return size;
}

EP_STATIC int ep_shstk_on(void) {
	if (ep_env_u64("EDGEPROBE_FENTRY_ASSUME_SHSTK", 0, 1)) /* tests of the refusal */
		return 1;
	unsigned long features = 0;
	/* ARCH_SHSTK_STATUS (Linux 6.6+); older kernels fail: no user shadow stacks */
	if (ep_sys2(SYS_arch_prctl, 0x5005, (long)&features) == 0) /* raw: errno untouched */
		return (features & 1) != 0; /* ARCH_SHSTK_SHSTK */
	return 0;
}

EP_SHARED uint32_t ep_fentry_mode(void) {
	uint32_t m = LOAD(&ep_fx_mode) & EP_FENTRY_USED;
	if (!ep_env_u64("EDGEPROBE_FENTRY_EXITS", 1, 1))
		m |= EP_FENTRY_EXITS_OFF;
	if (ep_shstk_on())
		m |= EP_FENTRY_SHSTK;
	if (!(m & (EP_FENTRY_EXITS_OFF | EP_FENTRY_SHSTK)))
		m |= EP_FENTRY_EXITS;
	return m;
}

EP_STATIC void ep_say_line(const char *msg) {
	if (getenv("EDGEPROBE_QUIET"))
		return;
	char buf[256], *p = buf, *end = buf + sizeof buf - 2;
	p = ep_append(p, end, "edgeprobe: ");
	p = ep_append(p, end, msg);
	*p++ = '\n';
	ssize_t r = write(2, buf, (size_t)(p - buf));
	(void)r;
}

/* Set up this thread's return-address stack (slow path, slot claimed). */
/* The graveyard: after the cap entries of the return-address stack (same
 * mapping, its pages touched only when used), entries dropped from it, the
 * newest per slot: a dropped entry's frame may still return through the
 * trampoline. The slot is given its return address back when its entry is
 * dropped, but a context switch may have copied ep_fentry_return out of it
 * first: a probed function that tail-calls swapcontext (`void yield(void)
 * { swapcontext(...); }` at -O2) has it saved as the context's resume
 * address, and when that coroutine is resumed after its entries were judged
 * dead (another coroutine's stack lies above its own), it "returns" to the
 * trampoline at that slot, whose entry is gone (review7: a scheduler of two
 * such coroutines on one thread died of SIGILL within ten switches). A
 * return through a slot with no live entry takes the graveyard's
 * (ep_fentry_exit_impl). Open addressing by slot, EP_RS_GRAVE_PROBE places
 * per slot; a full window drops its first place's entry (a frame that then
 * returns through a copy of the trampoline's address is lost, as before).
 * Written by the thread's own hooks only, inside their busy word. */
#define EP_RS_GRAVE 1024u /* power of two */
#define EP_RS_GRAVE_PROBE 8u

EP_STATIC size_t ep_rs_bytes(uint32_t cap) {
	return (((size_t)cap + EP_RS_GRAVE) * sizeof(struct ep_rframe) + 4095) & ~(size_t)4095;
}

EP_STATIC uint32_t ep_rs_grave_home(uint64_t slot) { return (uint32_t)((slot >> 3) * 0x9e3779b97f4a7c15ull >> 54); }

/* Remember a dropped entry: replaces the slot's older one. */
EP_STATIC void ep_rs_grave_put(const struct ep_rframe *f) {
	if (!ep_tls.rs || !f->slot || !f->ret)
		return;
	struct ep_rframe *g = ep_tls.rs + ep_tls.rs_cap;
	uint32_t h = ep_rs_grave_home(f->slot), k = EP_NONE;
	for (uint32_t j = 0; j < EP_RS_GRAVE_PROBE; j++) {
		uint32_t x = (h + j) & (EP_RS_GRAVE - 1);
		if (g[x].slot == f->slot) {
			k = x;
			break;
		}
		if (!g[x].slot && k == EP_NONE)
			k = x;
	}
	if (k == EP_NONE)
		k = h & (EP_RS_GRAVE - 1);
	g[k].slot = 0; /* never matched half-written (a signal's hook) */
	SIGFENCE();
	g[k].ret = f->ret;
	g[k].key = f->key;
	SIGFENCE();
	g[k].slot = f->slot;
}

/* The return address of a dropped entry at slot, 0 if none (taken out). */
EP_STATIC uint64_t ep_rs_grave_take(uint64_t slot) {
	if (!ep_tls.rs || !slot)
		return 0;
	struct ep_rframe *g = ep_tls.rs + ep_tls.rs_cap;
	uint32_t h = ep_rs_grave_home(slot);
	for (uint32_t j = 0; j < EP_RS_GRAVE_PROBE; j++) {
		uint32_t x = (h + j) & (EP_RS_GRAVE - 1);
		if (g[x].slot == slot) {
			uint64_t ret = g[x].ret;
			g[x].slot = 0;
			return ret;
		}
	}
	return 0;
}

EP_COLD void ep_rs_init(void) {
	static int said;
	uint32_t m = LOAD(&ep_fx_mode);
	ep_tls.rs_state = EP_RS_OFF;
	/* Under seccomp (D56) no arch_prctl: the shadow-stack state found at
	 * set-up stands (threads inherit it). mmap stays: the program's own
	 * allocator and threads need it, so no filter it runs under forbids it. */
	int nosys = ep_sys_off();
	if (nosys)
		ep_count_nosys();
	if ((m & EP_FENTRY_SHSTK) || ((m & EP_FENTRY_EXITS) && !nosys && ep_shstk_on())) {
		/* A return-address swap would fault on the shadow stack's check. */
		__atomic_fetch_or(&ep.hdr->fentry_mode, EP_FENTRY_SHSTK, __ATOMIC_RELAXED);
		if (!(m & EP_FENTRY_EXITS_OFF) && !__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
			ep_say_line("CET user shadow stack is on: fentry exit probes refused, counting entries only");
		return;
	}
	if (!(m & EP_FENTRY_EXITS))
		return;
	size_t bytes = ep_rs_bytes(ep.stack_depth);
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return;
	ep_tls.rs = p;
	ep_tls.rs_cap = ep.stack_depth;
	ep_tls.rs_n = 0;
	ep_tls.rs_state = EP_RS_ON;
}

EP_SHARED void ep_rs_free(void) {
	struct ep_rframe *rs = ep_tls.rs;
	uint32_t cap = ep_tls.rs_cap;
	ep_tls.rs_state = EP_RS_OFF;
	ep_tls.rs_n = 0;
	ep_tls.rs = NULL;
	SIGFENCE();
	if (rs)
		munmap(rs, ep_rs_bytes(cap));
}

/* ---- sites ---- */

/* Whether [a, a+n) is readable: the bytes before a function may lie on an
 * unmapped page (only checked when they are on another page than the call).
 * -1: cannot tell without a system call, under seccomp (D56). */
EP_STATIC int ep_readable(uint64_t a, uint64_t call) {
	if ((a >> 12) == (call >> 12))
		return 1;
	if (ep_sys_off()) {
		ep_count_nosys();
		return -1;
	}
	char buf[16];
	return ep_self_read(buf, a, (size_t)(call - a)) == (long)(call - a);
}

EP_INLINE int ep_is_endbr64(const uint8_t *p) {
	return p[0] == 0xf3 && p[1] == 0x0f && p[2] == 0x1e && p[3] == 0xfa;
}

/* The function key of the __fentry__ call returning to ret: the function's
 * start address. The call is the function's first instruction, or follows
 * endbr64: e8 rel32 (3d rel32 when a probe toggle made it inert meanwhile),
 * ff 15 rel32 (call through the GOT: gcc -fPIE/-fPIC, -fno-plt), or 67 e8
 * rel32 (a relaxed GOT call; recognised after endbr64 only, where it cannot
 * be confused with a previous function's last byte). gcc wraps the call in
 * push %r10 / pop %r10 (41 52 .. 41 5a) in functions with a static chain
 * (nested functions): recognised when both are there, and flagged
 * EP_SITE_R10. Anything else is keyed by the return address with
 * EP_KEY_BARE and gets no exit probe. */
EP_STATIC uint64_t ep_fentry_decode(uint64_t ret) {
	const uint8_t *p = (const uint8_t *)(uintptr_t)ret;
	uint64_t call;
	int rd;
	if (p[-5] == 0xe8 || p[-5] == 0x3d) {
		call = ret - 5;
		if ((rd = ep_readable(ret - 10, call)) < 0)
			return ret | EP_KEY_BARE; /* seccomp: the start cannot be checked (D56) */
		if (rd && p[-6] == 0x67 && ep_is_endbr64(p - 10))
			return ret - 10;
	} else if (p[-6] == 0xff && p[-5] == 0x15) {
		call = ret - 6;
	} else {
		return ret | EP_KEY_BARE;
	}
	uint64_t flag = 0;
	if ((rd = ep_readable(call - 6, call)) < 0)
		return ret | EP_KEY_BARE;
	if (rd) {
		const uint8_t *c = (const uint8_t *)(uintptr_t)call;
		if (c[-2] == 0x41 && c[-1] == 0x52 && p[0] == 0x41 && p[1] == 0x5a) {
			call -= 2;
			flag = EP_SITE_R10;
		}
	}
	if ((rd = ep_readable(call - 4, call)) < 0)
		return ret | EP_KEY_BARE;
	if (rd && ep_is_endbr64((const uint8_t *)(uintptr_t)(call - 4)))
		return (call - 4) | flag;
	return call | flag;
}

EP_COLD uint64_t ep_site_slow(uint64_t ret, uint32_t home) {
	for (uint32_t p = 0; p < EP_SITE_PROBES; p++) {
		struct ep_site *s = &ep_sites[(home + p) & (EP_SITES - 1)];
		uint64_t r = LOAD(&s->ret);
		if (r == ret) {
			uint64_t k = __atomic_load_n(&s->key, __ATOMIC_ACQUIRE);
			if (k)
				return k;
			break; /* being published by another thread */
		}
		if (r == 0) {
			uint64_t key = ep_fentry_decode(ret);
			if (__atomic_compare_exchange_n(&s->ret, &r, ret, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
				__atomic_store_n(&s->key, key, __ATOMIC_RELEASE);
				ADD(&ep.hdr->fentry_sites, 1);
				if (key & EP_KEY_BARE)
					ADD(&ep.hdr->fentry_bad_sites, 1);
				if (!(LOAD(&ep.hdr->fentry_mode) & EP_FENTRY_USED)) {
					__atomic_fetch_or(&ep.hdr->fentry_mode, EP_FENTRY_USED, __ATOMIC_RELAXED);
					__atomic_fetch_or(&ep_fx_mode, EP_FENTRY_USED, __ATOMIC_RELAXED); /* kept by fork children */
				}
				return key;
			}
			if (r == ret)
				break;
		}
	}
	return ep_fentry_decode(ret); /* table full around home: decode every time */
}

EP_INLINE uint64_t ep_site_key(uint64_t ret) {
	uint32_t home = (uint32_t)((ret * 0x9E3779B97F4A7C15ull) >> 50) & (EP_SITES - 1);
	struct ep_site *s = &ep_sites[home];
	if (likely(LOAD(&s->ret) == ret)) {
		uint64_t k = __atomic_load_n(&s->key, __ATOMIC_ACQUIRE);
		if (likely(k))
			return k;
	}
	return ep_site_slow(ret, home);
}

/* ---- recording ---- */

/* The exit of the function whose frame was pushed at depth d. Frames above
 * it died without an exit (longjmp, exceptions): counted unmatched. */
EP_STATIC void ep_exit_at(struct ep_thread *th, uint64_t key, uint32_t d, uint32_t ctl) {
	uint64_t now = (ctl & EP_CTL_NOTIME) ? 0 : ep_ticks();
	if (unlikely(th->depth <= d)) {
		/* its frame was popped already (as unmatched): an orphan exit */
		ep_exit_unframed(th, key, EP_UNFRAMED_ORPHAN);
		goto trace;
	}
	if (unlikely(th->depth > d + 1))
		ep_pop_to(th, d + 1);
	STORE(&th->depth, d);
	if (unlikely(d >= ep.stack_depth)) {
		ep_exit_unframed(th, key, EP_UNFRAMED_DEEP); /* not stored: untimed */
		goto trace;
	}
	struct ep_frame *fr = ep_frames(th) + d;
	if (unlikely(ep_frame_skip(fr))) {
		/* a cyg call's skip frame under ours (fentry pushes none) */
		OWN_ADD(&th->quota_skips, 1);
		goto trace;
	}
	if (unlikely(fr->fn != key)) {
		ep_exit_unframed(th, key, EP_UNFRAMED_ORPHAN);
		goto trace;
	}
	if (unlikely(ep_frame_stale(fr))) {
		ep_pop_unmatched(th, d + 1, d);
		ep_exit_unframed(th, key, EP_UNFRAMED_ORPHAN);
		goto trace;
	}
	ep_exit_frame(th, fr, now);
trace:
	if (unlikely(ctl & EP_CTL_TRACE))
		ep_trace_at(th, ctl, EP_EV_EXIT, key, th->depth);
}

EP_INLINE void ep_fentry_record_exit(struct ep_thread *th, const struct ep_rframe *f, uint32_t ctl) {
	if (likely(f->epoch == ep_epoch)) {
		ep_exit_at(th, f->key, f->d, ctl);
	} else {
		/* pushed before fork, in the parent's region */
		ep_exit_unframed(th, f->key, EP_UNFRAMED_ORPHAN);
		if (ctl & EP_CTL_TRACE)
			ep_trace_at(th, ctl, EP_EV_EXIT, f->key, th->depth);
	}
}

/* Forget return-stack entry f, whose frame is dead. If its slot lies below
 * our own stack pointer (free stack, or another stack) and still holds the
 * trampoline, give the original return address back: should the frame be
 * alive after all (a coroutine's stack), it returns normally, unmeasured.
 * Slots between our stack pointer and the current slot hold our own frames
 * now: that frame is certainly dead. (Callers keep f in the graveyard.) */
EP_STATIC void ep_rs_forget(struct ep_thread *th, const struct ep_rframe *f, uint64_t mysp) {
	uint64_t *slot = (uint64_t *)(uintptr_t)f->slot;
	if (f->slot < mysp && LOAD(slot) == EP_TRAMP) {
		STORE(slot, f->ret);
		if (th)
			OWN_ADD(&th->fentry_restored, 1);
	}
}

/* Count the shadow frames of dead return-stack entries [n, old_n) unmatched. */
EP_STATIC void ep_rs_drop(struct ep_thread *th, uint32_t n, uint32_t old_n, uint64_t mysp) {
	uint32_t dmin = EP_NONE;
	for (uint32_t i = n; i < old_n; i++) {
		if (ep_tls.rs[i].epoch == ep_epoch && ep_tls.rs[i].d < dmin)
			dmin = ep_tls.rs[i].d;
		ep_rs_grave_put(&ep_tls.rs[i]); /* oldest first: the newest per slot stays */
	}
	/* Slots newest first: of two entries for one slot (a dead frame's and
	 * a later frame's at the same address) the slot holds the later hijack,
	 * which its own entry gives back; the dead one then finds no trampoline
	 * there to overwrite with its stale address. */
	for (uint32_t i = old_n; i > n; i--)
		ep_rs_forget(th, &ep_tls.rs[i - 1], mysp);
	ep_tls.rs_n = n;
	if (dmin != EP_NONE)
		ep_pop_to(th, dmin);
}

/* An entry at slot found return-stack entries at or below its own slot: the
 * stack was popped past them without their returns (longjmp, exceptions), or
 * the entry's caller tail-called it (same slot, still hijacked: the caller's
 * exit happens now). Sets *orig to the return address to save for the new
 * frame, 0 when it cannot be known. Returns the new depth of the stack. */
EP_COLD uint32_t ep_fentry_resync(struct ep_thread *th, uint64_t slot, uint64_t *orig, uint32_t ctl) {
	uint64_t mysp = EP_HERE();
	struct ep_rframe *rs = ep_tls.rs;
	uint32_t n = ep_tls.rs_n, old = n;
	uint64_t lo = 0, hi = ~0ull;
	if (n && rs[n - 1].slot < slot) {
		/* On a signal stack the frames below us on the thread's stack are
		 * alive: only frames on the signal stack itself can be dead. */
		stack_t ss;
		if (ep_sys_off()) {
			/* seccomp (D56): cannot ask, so this may be a handler on a
			 * signal stack over a hook it interrupted before that hook
			 * hijacked its slot (dropping its entry then loses the return
			 * address): drop nothing. Dead entries stay until their slot
			 * is reused or the stack is full (counted then). */
			ep_count_nosys();
			lo = hi = 0;
		} else if (ep_on_altstack(&ss)) {
			lo = (uint64_t)(uintptr_t)ss.ss_sp;
			hi = lo + ss.ss_size;
		}
	}
	while (n && rs[n - 1].slot < slot && rs[n - 1].slot >= lo && rs[n - 1].slot < hi)
		n--;
	if (n != old)
		ep_rs_drop(th, n, old, mysp);
	if (n && rs[n - 1].slot == slot) {
		struct ep_rframe f = rs[n - 1];
		n--;
		ep_tls.rs_n = n;
		if (*orig == EP_TRAMP) {
			/* tail call: the caller's frame ends here */
			ep_fentry_record_exit(th, &f, ctl);
			*orig = f.ret;
		} else if (f.epoch == ep_epoch) {
			ep_rs_drop(th, n, n + 1, mysp);
		}
	} else if (*orig == EP_TRAMP) {
		*orig = 0;
	}
	return n;
}

/* gregs: __fentry__'s save area (rax, rdi..r9, r10); vsave: the slow path's
 * xsave area (NULL on the fast path: xmm0-7 are live). Both are only read
 * by the argument capture (edgeprobe_args.c). */
EP_INLINE int ep_fentry_enter_impl(uint64_t ret, uint64_t *slotp, int may_slow, uint64_t here, uint64_t hret,
                                   const uint64_t *gregs, const void *vsave) {
	struct ep_thread *th = ep_tls.slot;
	if (unlikely((uintptr_t)th < EP_SLOT_MIN)) {
		if (th == EP_TS_NONE && may_slow && !ep_tls.busy && __atomic_load_n(&ep_state, __ATOMIC_ACQUIRE) != 3)
			return 1;
		if (!(th = ep_claim())) /* counts the drop; no libc unless claiming */
			return 0;
	}
	if (unlikely(ep_tls.busy) && ep_busy_live(th, here)) {
		OWN_ADD(&th->reentrant_drops, 1);
		return 0;
	}
	uint32_t ctl = LOAD(&ep.hdr->control);
	if (unlikely(ctl & EP_CTL_PAUSE))
		return 0;
	if (unlikely(ep_tls.rs_state == EP_RS_UNSET)) {
		if (may_slow)
			return 1;
		ep_tls.rs_state = EP_RS_OFF;
	}
	ep_tls.busy_ret = hret;
	SIGFENCE();
	ep_tls.busy = here;
	SIGFENCE();
	uint64_t t0 = ep_sample_start(th, ctl);
	uint64_t key = ep_site_key(ret);
	if (unlikely(key & EP_SITE_R10)) {
		key &= ~EP_SITE_R10;
		slotp++;
	}
	uint64_t h0 = 0;
	if (unlikely(ctl & EP_CTL_ARGS))
		h0 = th->ring_head;
	if (likely(ep_tls.rs_state == EP_RS_ON && !(key & EP_KEY_BARE))) {
		uint64_t slot = (uint64_t)(uintptr_t)slotp;
		uint64_t orig = *slotp;
		uint32_t n = ep_tls.rs_n;
		if (unlikely((n && ep_tls.rs[n - 1].slot <= slot) || orig == EP_TRAMP))
			n = ep_fentry_resync(th, slot, &orig, ctl);
		if (unlikely(n >= ep_tls.rs_cap || orig == 0)) {
			OWN_ADD(&th->stack_overflows, 1);
			ep_count_entry(th, key, ctl, 1);
		} else {
			if (likely(ep_enter(th, key, ctl, slot, ret, 0))) { /* recorded: probe the exit */
				struct ep_rframe *f = ep_tls.rs + n;
				f->slot = slot;
				f->ret = orig;
				f->key = key;
				f->d = th->depth - 1;
				f->epoch = ep_epoch;
				ep_tls.rs_n = n + 1;
				SIGFENCE();
				*slotp = EP_TRAMP;
			}
		}
	} else {
		ep_count_entry(th, key, ctl, 0);
	}
	if (unlikely(ctl & EP_CTL_ARGS))
		ep_args_entry(th, key, h0, gregs, slotp, vsave);
	ep_sample_end(th, t0);
	SIGFENCE();
	ep_tls.busy = 0;
	return 0;
}

/* Called by __fentry__ with xmm0-7 saved: must not call into libc. Returns 1
 * for the slow path (the caller saves the whole vector state first). */
__attribute__((visibility("hidden"), no_instrument_function)) int ep_fentry_enter(uint64_t ret, uint64_t *slotp,
                                                                               const uint64_t *gregs) {
	return ep_fentry_enter_impl(ret, slotp, 1, EP_HERE(), (uint64_t)(uintptr_t)__builtin_return_address(0), gregs, NULL);
}

__attribute__((visibility("hidden"), no_instrument_function, cold)) void ep_fentry_enter_slow(uint64_t ret, uint64_t *slotp,
                                                                                            const uint64_t *gregs,
                                                                                            const void *vsave) {
	uint64_t here = EP_HERE(), hret = (uint64_t)(uintptr_t)__builtin_return_address(0);
	int saved_errno = errno; /* the return-address stack's mmap, the CET check: libc */
	if (ep_tls.slot == EP_TS_NONE)
		ep_claim();
	if ((uintptr_t)ep_tls.slot >= EP_SLOT_MIN && ep_tls.rs_state == EP_RS_UNSET &&
	    !(ep_tls.busy && ep_busy_live(ep_tls.slot, here))) {
		ep_tls.busy_ret = hret;
		SIGFENCE();
		ep_tls.busy = here;
		SIGFENCE();
		ep_rs_init();
		SIGFENCE();
		ep_tls.busy = 0;
	}
	errno = saved_errno;
	ep_fentry_enter_impl(ret, slotp, 0, here, hret, gregs, vsave);
}

/* A return through a slot with no entry on this thread's stack nor in its
 * graveyard: an entry leaves the stack only when its frame returns, when
 * its slot is given back (ep_rs_forget; the graveyard keeps it), when its
 * context is parked by swapcontext (edgeprobe_ctx.c: it comes back with the
 * context, on whatever thread), or when our own frames have overwritten the
 * slot; but a coroutine switched by something else than libc's swapcontext
 * and resumed on another thread returns there with its entry on the thread
 * it entered on (review7; docs/runtime.md, fentry limits), and a full
 * graveyard window forgets. There is no address to return to; say so and
 * stop with a trap rather than jump anywhere. */
EP_COLD void ep_fentry_lost(uint64_t slot) {
	char buf[320], *p = buf, *end = buf + sizeof buf - 2;
	p = ep_append(p, end, "edgeprobe: fentry return through an unknown frame (slot 0x");
	for (int i = 60; i >= 0; i -= 4)
		*p++ = "0123456789abcdef"[(slot >> i) & 15];
	/* The one known way here (docs/runtime.md): a coroutine that entered a
	 * probed function on another thread; the message names the way out. */
	p = ep_append(p, end, "): the return address is lost (a coroutine switched without libc's swapcontext "
	                      "and resumed on another thread? EDGEPROBE_FENTRY_EXITS=0 probes entries only)\n");
	ssize_t r = write(2, buf, (size_t)(p - buf));
	(void)r;
	__builtin_trap();
}

/* The return-stack entry of the frame returning through slot: the newest
 * entry with that slot; EP_NONE when there is none (then the graveyard's). */
EP_COLD uint32_t ep_fentry_find(uint64_t slot) {
	uint32_t n = ep_tls.rs_n;
	for (uint32_t i = n; i > 0; i--)
		if (ep_tls.rs[i - 1].slot == slot)
			return i - 1;
	return EP_NONE; /* the graveyard's, or lost (ep_fentry_exit_impl) */
}

struct ep_ret2 {
	uint64_t ret;
	uint64_t slow;
};

/* Entries above i, the frame returning now: those below its slot on the
 * stack are dead (counted, slots given back when free); those above it are
 * on another stack (a coroutine) and stay, moved down over i. Returns the
 * new stack size with i removed. */
EP_COLD uint32_t ep_rs_unlink(struct ep_thread *th, uint32_t i, uint32_t n, uint64_t mysp) {
	struct ep_rframe *rs = ep_tls.rs;
	uint64_t slot = rs[i].slot;
	uint32_t w = i;
	uint32_t dmin = EP_NONE;
	/* slots given back newest first, as in ep_rs_drop */
	for (uint32_t j = n; j > i + 1; j--)
		if (rs[j - 1].slot <= slot)
			ep_rs_forget(th, &rs[j - 1], mysp);
	for (uint32_t j = i + 1; j < n; j++) {
		if (rs[j].slot > slot) {
			rs[w++] = rs[j];
			continue;
		}
		if (th && rs[j].epoch == ep_epoch && rs[j].d < dmin)
			dmin = rs[j].d;
		if (th)
			ep_rs_grave_put(&rs[j]);
	}
	if (th && dmin != EP_NONE && dmin > rs[i].d)
		ep_pop_to(th, dmin);
	return w;
}

/* rregs: the trampoline's save area (rax, rdx, xmm0, xmm1), read only by
 * the return-value capture. */
EP_INLINE struct ep_ret2 ep_fentry_exit_impl(uint64_t sp, int may_slow, uint64_t here, uint64_t hret,
                                             const uint64_t *rregs) {
	uint64_t slot = sp - 8;
	struct ep_rframe *rs = ep_tls.rs;
	uint32_t n = ep_tls.rs_n, i;
	if (likely(n && rs && rs[n - 1].slot == slot))
		i = n - 1;
	else if ((i = ep_fentry_find(slot)) == EP_NONE) {
		/* A frame whose entry was dropped (counted unmatched then) returns
		 * through a copy of the trampoline's address (the graveyard, above):
		 * back to its own return address, nothing recorded. */
		struct ep_ret2 g = {ep_rs_grave_take(slot), 0};
		if (!g.ret)
			ep_fentry_lost(slot);
		return g;
	}
	struct ep_rframe f = rs[i];
	struct ep_ret2 r = {f.ret, 0};
	struct ep_thread *th = ep_tls.slot;
	if (unlikely((uintptr_t)th < EP_SLOT_MIN || (ep_tls.busy && ep_busy_live(th, here)))) {
		if (th == EP_TS_NONE && may_slow && !ep_tls.busy && __atomic_load_n(&ep_state, __ATOMIC_ACQUIRE) != 3) {
			r.slow = 1; /* a fork child's first hook: claim a slot to count the exit */
			return r;
		}
		/* the entry must go whatever is counted: its frame is returning */
		ep_tls.rs_n = i + 1 == n ? i : ep_rs_unlink(NULL, i, n, here);
		if ((uintptr_t)th >= EP_SLOT_MIN)
			OWN_ADD(&th->reentrant_drops, 1);
		return r;
	}
	ep_tls.busy_ret = hret;
	SIGFENCE();
	ep_tls.busy = here;
	SIGFENCE();
	uint32_t ctl = LOAD(&ep.hdr->control);
	uint64_t t0 = ep_sample_start(th, ctl);
	ep_tls.rs_n = likely(i + 1 == n) ? i : ep_rs_unlink(th, i, n, here);
	if (likely(!(ctl & EP_CTL_PAUSE))) {
		uint64_t h0 = unlikely(ctl & EP_CTL_ARGS) ? th->ring_head : 0;
		ep_fentry_record_exit(th, &f, ctl);
		if (unlikely(ctl & EP_CTL_ARGS))
			ep_args_exit(th, f.key, h0, rregs);
	}
	ep_sample_end(th, t0);
	SIGFENCE();
	ep_tls.busy = 0;
	return r;
}

/* Called by ep_fentry_return with rax, rdx, xmm0, xmm1 saved (no libc). */
__attribute__((visibility("hidden"), no_instrument_function)) struct ep_ret2 ep_fentry_exit(uint64_t sp, const uint64_t *rregs) {
	return ep_fentry_exit_impl(sp, 1, EP_HERE(), (uint64_t)(uintptr_t)__builtin_return_address(0), rregs);
}

__attribute__((visibility("hidden"), no_instrument_function, cold)) uint64_t ep_fentry_exit_slow(uint64_t sp,
                                                                                               const uint64_t *rregs) {
	if (ep_tls.slot == EP_TS_NONE)
		ep_claim();
	return ep_fentry_exit_impl(sp, 0, EP_HERE(), (uint64_t)(uintptr_t)__builtin_return_address(0), rregs).ret;
}

/* ---- contexts switched by swapcontext (edgeprobe_ctx.c, D102) ----
 *
 * The running context's entries, [ctx_rs_base, rs_n), leave this thread's
 * stack when it is switched out and are written into a record on its own
 * stack (swapcontext's frame, which stays put while the context is
 * suspended); whichever thread resumes it puts them on its own stack. */

_Static_assert(sizeof(struct ep_rframe) == EP_RS_ENTRY, "EP_RS_ENTRY is the size of a return-stack entry");

/* How many entries the running context owns. */
EP_SHARED_COLD uint32_t ep_rs_ctx_count(void) {
	if (ep_tls.rs_state != EP_RS_ON || !ep_tls.rs)
		return 0;
	uint32_t n = ep_tls.rs_n, b = ep_tls.ctx_rs_base;
	return b < n ? n - b : 0;
}

/* Take the top k entries off this thread's stack into out, oldest first;
 * returns how many it took (k, or 0 when there are not k).
 * The shadow frames [dbase, dtop) travel with them: an entry's depth is
 * kept relative to dbase, or EP_NONE when its frame is not among them (its
 * exit is then an orphan). Inside the caller's busy word. */
EP_SHARED_COLD uint32_t ep_rs_ctx_park(void *out, uint32_t k, uint32_t dbase, uint32_t dtop) {
	struct ep_rframe *o = out, *rs = ep_tls.rs;
	uint32_t n = ep_tls.rs_n;
	if (!k || !rs || k > n)
		return 0;
	for (uint32_t i = 0; i < k; i++) {
		o[i] = rs[n - k + i];
		uint32_t d = o[i].d;
		o[i].d = (o[i].epoch == ep_epoch && d >= dbase && d < dtop) ? d - dbase : EP_NONE;
	}
	SIGFENCE();
	ep_tls.rs_n = n - k;
	ep_tls.ctx_rs_base = n - k;
	return k;
}

/* Give entries [from, to) of p up: each frame gets its return address back
 * in its slot and returns normally, unmeasured (its shadow frame, if any,
 * is counted unmatched where it lies). Only slots above here (the caller's
 * frame) are written: they are in suspended frames of the stack this thread
 * runs on, so no other thread can be using them; an entry below is dead (a
 * longjmp left it), its slot free stack or one of our own frames now.
 * Newest first: should a dead entry and a live one share a slot, the slot
 * holds the live one's hijack, and once given back it no longer holds the
 * trampoline for the dead one to write over. */
EP_STATIC void ep_rs_give_back(struct ep_thread *th, const struct ep_rframe *p, uint32_t from, uint32_t to, uint64_t here,
                               int count) {
	for (uint32_t i = to; i > from; i--) {
		uint64_t *slot = (uint64_t *)(uintptr_t)p[i - 1].slot;
		if (p[i - 1].slot > here && LOAD(slot) == EP_TRAMP) {
			STORE(slot, p[i - 1].ret);
			if (count && (uintptr_t)th >= EP_SLOT_MIN)
				OWN_ADD(&th->fentry_restored, 1);
		}
	}
}

/* The running context's entries, too many to park (edgeprobe_ctx.c caps
 * the record): give them up in place and take them off the stack. Inside
 * the caller's busy word. */
EP_SHARED_COLD void ep_rs_ctx_giveup(struct ep_thread *th) {
	uint32_t k = ep_rs_ctx_count(), n = ep_tls.rs_n;
	if (!k)
		return;
	ep_rs_give_back(th, ep_tls.rs, n - k, n, EP_HERE(), 1);
	SIGFENCE();
	ep_tls.rs_n = n - k;
	ep_tls.ctx_rs_base = n - k;
}

/* Put k parked entries on this thread's stack, oldest first: mode 1, their
 * frames now start at shadow depth dbase; mode 2, their frames did not come
 * (depths EP_NONE); mode 0, this thread's stack may not be touched (a hook
 * of this thread is live: the context was resumed by a signal handler that
 * interrupted it). Entries that cannot be kept (mode 0, no stack, stack
 * full: the newest ones) are given back in place (ep_rs_give_back).
 * Inside the caller's busy word (modes 1, 2). */
EP_SHARED_COLD void ep_rs_ctx_unpark(struct ep_thread *th, const void *in, uint32_t k, uint32_t dbase, int mode) {
	const struct ep_rframe *p = in;
	if (mode && ep_tls.rs_state == EP_RS_UNSET)
		ep_rs_init(); /* libc: the caller saved errno */
	int keep = mode && ep_tls.rs_state == EP_RS_ON && ep_tls.rs;
	uint32_t n = keep ? ep_tls.rs_n : 0, i = 0;
	if (keep) {
		ep_tls.ctx_rs_base = n;
		for (; i < k && n < ep_tls.rs_cap; i++) {
			struct ep_rframe f = p[i];
			if (f.d != EP_NONE)
				f.d = mode == 1 ? f.d + dbase : EP_NONE;
			ep_tls.rs[n++] = f;
		}
		SIGFENCE();
		ep_tls.rs_n = n;
	}
	/* mode 0: the live hook may be counting */
	ep_rs_give_back(th, p, i, k, EP_HERE(), mode != 0);
}

/* ---- unwinding through hijacked frames ----
 *
 * The unwinder reaches ep_fentry_return as the return address of a hijacked
 * frame, finds the trampoline's FDE and calls this personality for the
 * trampoline's frame before it reads that frame's return address from
 * CFA - 8, which is the hijacked slot: we write the original return address
 * back there. Every frame the unwinder walks through is going to be unwound
 * (phase 1 stops at the handler's frame, whose own slot it does not read),
 * so the entry stays on the return-address stack as a dead frame: its exit is
 * counted unmatched, like a longjmp's. */

typedef uintptr_t (*ep_getcfa_fn)(void *);
extern uintptr_t _Unwind_GetCFA(void *) __attribute__((weak));
static ep_getcfa_fn ep_getcfa;

/* _Unwind_GetCFA of the unwinder calling us: libgcc_s linked by the program,
 * or the copy glibc dlopens privately for pthread_exit/cancel (found from our
 * caller's address). */
EP_STATIC uint64_t ep_unwind_cfa(void *ctx, void *caller) {
	ep_getcfa_fn fn = __atomic_load_n(&ep_getcfa, __ATOMIC_ACQUIRE);
	if (!fn) {
		Dl_info di;
		if (dladdr(caller, &di) && di.dli_fname) {
			void *h = dlopen(di.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
			if (h) {
				void *sym = dlsym(h, "_Unwind_GetCFA");
				memcpy(&fn, &sym, sizeof fn);
				dlclose(h);
			}
		}
		if (!fn && _Unwind_GetCFA)
			fn = _Unwind_GetCFA;
		if (!fn)
			return 0;
		__atomic_store_n(&ep_getcfa, fn, __ATOMIC_RELEASE);
	}
	return (uint64_t)fn(ctx);
}

#define EP_URC_FATAL_PHASE2_ERROR 2
#define EP_URC_FATAL_PHASE1_ERROR 3
#define EP_URC_CONTINUE_UNWIND 8
#define EP_UA_SEARCH_PHASE 1

__attribute__((visibility("hidden"), no_instrument_function)) int ep_fentry_personality(int version, int actions,
                                                                                     uint64_t cls, void *exc, void *ctx) {
	(void)version, (void)cls, (void)exc;
	int fatal = (actions & EP_UA_SEARCH_PHASE) ? EP_URC_FATAL_PHASE1_ERROR : EP_URC_FATAL_PHASE2_ERROR;
	uint64_t cfa = ep_unwind_cfa(ctx, __builtin_return_address(0));
	struct ep_rframe *rs = ep_tls.rs;
	uint32_t n = ep_tls.rs_n;
	uint64_t here = (uint64_t)(uintptr_t)__builtin_frame_address(0);
	for (uint32_t i = n; i > 0 && rs; i--) {
		uint64_t slot = rs[i - 1].slot;
		uint64_t *sp = (uint64_t *)(uintptr_t)slot;
		/* without the CFA: the innermost live hijacked frame above us, the
		 * one the unwinder is at (it walks them innermost first) */
		if (cfa ? slot == cfa - 8 : (slot > here && *sp == EP_TRAMP)) {
			if (*sp == EP_TRAMP) {
				*sp = rs[i - 1].ret;
				if (__atomic_load_n(&ep_state, __ATOMIC_ACQUIRE) == 2 && ep_region_pid == getpid())
					ADD(&ep.hdr->fentry_unwound, 1);
			}
			return EP_URC_CONTINUE_UNWIND;
		}
	}
	if (cfa && *(uint64_t *)(uintptr_t)(cfa - 8) != EP_TRAMP)
		return EP_URC_CONTINUE_UNWIND; /* restored already */
	return fatal;
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
