/* edgeprobe_args.c: argument and return-value capture for fentry probes.
 *
 * Owns the capture plans' lookup (header.argplan, written by a capture) and
 * the EP_EV_DATA records (edgeprobe_shm.h describes their layout) that follow
 * an ENTER or EXIT event of a planned function while EP_CTL_ARGS is set.
 * Called from ep_fentry_enter_impl / ep_fentry_exit_impl (edgeprobe_fentry.c)
 * behind one test of the control word they have loaded anyway; nothing here
 * runs unless a capture asked for arguments (docs/tracing.md, docs/runtime.md).
 *
 * Where the values come from:
 *   - the integer argument registers from __fentry__'s save area (it saves
 *     rdi..r9 before calling C);
 *   - the SSE argument registers live: the fast path saves no vector register
 *     and everything between __fentry__ and here is compiled general-regs-only
 *     and calls no libc (the vDSO clock is GPR-only), so xmm0-7 still hold the
 *     arguments when ep_args_entry reads them first thing; on the slow path
 *     (a thread's first hook: libc ran) they come from the xsave area, whose
 *     legacy region holds xmm0 at byte 160;
 *   - stack arguments from the caller's frame above the return slot (the ABI
 *     says they are there when DWARF says the function takes them);
 *   - a char * argument's bytes with process_vm_readv on our own pid: the
 *     kernel copies what is mapped and readable and stops at the first fault,
 *     so a bad pointer is reported unreadable instead of faulting the host.
 *     Copied at entry: the bytes the function received, not what they became.
 *   - return values from the trampoline's save area (rax, rdx, xmm0, xmm1).
 *
 * A record is written only right after its own event (the newest event in the
 * ring, written by this hook): an event the full ring dropped gets no record,
 * and a record that does not fit is dropped and counted in ring_dropped like
 * any event.
 *
 * Locking: none; runs inside the hook's busy window (signal handlers' hooks
 * are dropped meanwhile), so one writer per ring.
 */
#include "edgeprobe_internal.h"

/* The plan's spec for key, 0 when it has none. */
EP_STATIC uint64_t ep_plan(uint64_t key) {
	struct ep_argplan *t = ep.hdr->argplan;
	uint32_t home = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 57);
	for (uint32_t p = 0; p < EP_ARGPLANS; p++) {
		struct ep_argplan *e = &t[(home + p) & (EP_ARGPLANS - 1)];
		uint64_t k = __atomic_load_n(&e->key, __ATOMIC_ACQUIRE);
		if (k == key)
			return LOAD(&e->spec);
		if (k == 0)
			return 0;
	}
	return 0;
}

/* A compiler barrier in a loop body: without it gcc and clang may turn a
 * copy loop into a call of libc's memcpy/memset, whose AVX versions end in
 * vzeroupper and would clear the upper halves of the probed function's
 * ymm arguments (the fast path does not save them). */
#define EP_NO_IDIOM() __asm__ volatile("" ::: "memory")

/* Copy the string at p into w (status word, then the bytes); returns the
 * number of words written (1 to 1 + EP_STR_MAX / 8). Calls no libc (raw
 * system calls: the probed thread's errno stays as it was). */
EP_STATIC uint32_t ep_copy_str(uint64_t p, uint64_t *w) {
	union {
		char c[EP_STR_MAX];
		uint64_t u[EP_STR_MAX / 8];
	} buf;
	for (uint32_t i = 0; i < EP_STR_MAX / 8; i++) {
		EP_NO_IDIOM();
		buf.u[i] = 0;
	}
	if (p < 4096) { /* NULL and the page no process maps */
		w[0] = p ? EP_STR_FAULT : 0;
		return 1;
	}
	long n = ep_self_read(buf.c, p, EP_STR_MAX); /* errno untouched: the program may test it */
	if (n <= 0) {
		w[0] = EP_STR_FAULT;
		return 1;
	}
	uint32_t len = 0, status = 0;
	while (len < (uint32_t)n && buf.c[len]) {
		EP_NO_IDIOM();
		len++;
	}
	if (len < (uint32_t)n)
		status = EP_STR_COMPLETE;
	w[0] = status | len;
	uint32_t nw = (len + 7) / 8;
	for (uint32_t i = 0; i < nw; i++) {
		EP_NO_IDIOM();
		uint64_t v = buf.u[i];
		uint32_t have = len - 8 * i; /* bytes of the string in this word */
		if (have < 8)
			v &= (1ull << (8 * have)) - 1; /* past the NUL (or the copy): not the string's */
		w[1 + i] = v;
	}
	return 1 + nw;
}

/* Append the record (header + nw words) after the event of (kind, key) this
 * hook wrote (the head was h0 when the hook began), if the ring holds it. */
EP_STATIC void ep_put_data(struct ep_thread *th, uint64_t h0, uint32_t kind, uint64_t key, uint32_t sub, uint64_t spec,
                           const uint64_t *w, uint32_t nw) {
	uint64_t h = th->ring_head;
	uint32_t size = th->ring_size; /* the size its event was written with */
	if (h <= h0 || !ep.ring_events || !size)
		return;
	/* The hook writes its own event last (a tail call's exit of the caller,
	 * or exits of dead frames, come before it): the record belongs after
	 * the newest event if that is this call's. */
	uint64_t mask = size - 1;
	struct ep_event *ring = ep_ring(th);
	struct ep_event *ev = ring + ((h - 1) & mask);
	if ((LOAD(&ev->tsk) >> EP_EV_KIND_SHIFT) != kind || LOAD(&ev->fn) != key)
		return;
	uint32_t slots = (nw + 1) / 2;
	if (h - th->ring_tail_cache + slots >= size) {
		th->ring_tail_cache = __atomic_load_n(&th->ring_tail, __ATOMIC_ACQUIRE);
		if (h - th->ring_tail_cache + slots >= size) {
			OWN_ADD(&th->ring_dropped, 1);
			return;
		}
	}
	struct ep_event *e = ring + (h & mask);
	STORE(&e->tsk, ((uint64_t)EP_EV_DATA << EP_EV_KIND_SHIFT) | ((uint64_t)sub << EP_DATA_SUB_SHIFT) |
	                   ((uint64_t)slots << EP_DATA_SLOTS_SHIFT) | (spec & EP_DATA_SPEC_MASK));
	STORE(&e->fn, key);
	for (uint32_t i = 0; i < slots; i++) {
		e = ring + ((h + 1 + i) & mask);
		STORE(&e->tsk, w[2 * i]);
		STORE(&e->fn, 2 * i + 1 < nw ? w[2 * i + 1] : 0);
	}
	__atomic_store_n(&th->ring_head, h + 1 + slots, __ATOMIC_RELEASE);
}

#define EP_READ_XMM(i, v) __asm__ volatile("movq %%xmm" #i ", %0" : "=r"(v))

/* The arguments of the call whose ENTER event (key) this hook wrote (the
 * ring head was h0 before).
 * gregs: __fentry__'s save area (rax, rdi, rsi, rdx, rcx, r8, r9, r10);
 * slot: the function's return slot (stack arguments start above it);
 * vsave: the slow path's xsave area, NULL when xmm0-7 are still live. */
EP_SHARED_COLD void ep_args_entry(struct ep_thread *th, uint64_t key, uint64_t h0, const uint64_t *gregs,
                                  const uint64_t *slot, const void *vsave) {
	uint64_t x[8];
	if (vsave) {
		const uint64_t *legacy = (const uint64_t *)((const char *)vsave + 160);
		for (int i = 0; i < 8; i++)
			x[i] = legacy[2 * i];
	} else {
		/* first thing: nothing since __fentry__ touched them (see above) */
		EP_READ_XMM(0, x[0]);
		EP_READ_XMM(1, x[1]);
		EP_READ_XMM(2, x[2]);
		EP_READ_XMM(3, x[3]);
		EP_READ_XMM(4, x[4]);
		EP_READ_XMM(5, x[5]);
		EP_READ_XMM(6, x[6]);
		EP_READ_XMM(7, x[7]);
	}
	uint64_t spec = ep_plan(key);
	if (!(spec & EP_PLAN_ENTRY))
		return;
	uint64_t w[6 + 8 + EP_STACK_MAX / 8 + 6 * (1 + EP_STR_MAX / 8)];
	uint32_t n = 0;
	uint32_t im = EP_PLAN_INT(spec), sm = EP_PLAN_SSE(spec), strm = EP_PLAN_STR(spec) & im;
	uint32_t stack = EP_PLAN_STACK(spec);
	if (stack > EP_STACK_MAX)
		stack = EP_STACK_MAX;
	for (int i = 0; i < 6; i++)
		if (im & (1u << i))
			w[n++] = gregs[1 + i];
	for (int i = 0; i < 8; i++)
		if (sm & (1u << i))
			w[n++] = x[i];
	for (uint32_t i = 0; i < (stack + 7) / 8; i++)
		w[n++] = LOAD(&slot[1 + i]);
	/* The program runs under seccomp (edgeprobe_seccomp.c, D56): no more
	 * system calls here; the record's spec then shows bare pointers. */
	if (strm && ep_sys_off())
		strm = 0;
	for (int i = 0; i < 6; i++)
		if (strm & (1u << i))
			n += ep_copy_str(gregs[1 + i], w + n);
	spec = (spec & ~(0x7full << 24 | 0x3full << 16)) | ((uint64_t)stack << 24) | ((uint64_t)strm << 16);
	ep_put_data(th, h0, EP_EV_ENTER, key, EP_DATA_ARGS, spec, w, n);
}

/* The return value of the call whose EXIT event (key) this hook wrote (the
 * ring head was h0 before).
 * rregs: the trampoline's save area (rax, rdx, xmm0 (16 bytes), xmm1). */
EP_SHARED_COLD void ep_args_exit(struct ep_thread *th, uint64_t key, uint64_t h0, const uint64_t *rregs) {
	uint64_t spec = ep_plan(key);
	if (!(spec & EP_PLAN_EXIT))
		return;
	uint64_t w[4 + 1 + EP_STR_MAX / 8];
	uint32_t n = 0;
	uint32_t im = EP_PLAN_RINT(spec), sm = EP_PLAN_RSSE(spec);
	if (im & 1)
		w[n++] = rregs[0];
	if (im & 2)
		w[n++] = rregs[1];
	if (sm & 1)
		w[n++] = rregs[2];
	if (sm & 2)
		w[n++] = rregs[4];
	if ((spec & EP_PLAN_RSTR) && ep_sys_off())
		spec &= ~EP_PLAN_RSTR; /* seccomp: a bare pointer, as at entry */
	if (spec & EP_PLAN_RSTR)
		n += ep_copy_str(rregs[0], w + n);
	ep_put_data(th, h0, EP_EV_EXIT, key, EP_DATA_RET, spec, w, n);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
