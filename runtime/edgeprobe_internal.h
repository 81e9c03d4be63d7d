/* edgeprobe_internal.h: what the runtime's files share (private, never installed).
 *
 * The runtime is the LD_PRELOAD library behind edgeprobe's probes. It defines
 * the -finstrument-functions hooks (__cyg_profile_func_enter/exit and clang's
 * __cyg_profile_func_enter_bare) and the -pg -mfentry hook (__fentry__, in
 * edgeprobe_fentry.S, whose exits are probed by hijacking the return address;
 * C halves in edgeprobe_fentry.c) and records, per function address, entries,
 * exits and inclusive latency into a shared-memory region (an anonymous memfd,
 * "/memfd:edgeprobe" in /proc/<pid>/fd; layout in edgeprobe_shm.h, reader in
 * internal/shm, description in docs/runtime.md). Its files, by concern:
 *
 *   edgeprobe_region.c    the region (memfd, header, limits, clock
 *                         calibration) and the shared function table
 *   edgeprobe_thread.c    per-thread state: slot claim, the busy word and its
 *                         staleness, shadow-stack healing and slow exits,
 *                         thread exit
 *   edgeprobe_cyg.c       the -finstrument-functions hooks
 *   edgeprobe_fentry.c    the C side of __fentry__ and of the return
 *                         trampoline (site table, return-address stack,
 *                         unwinder personality); edgeprobe_fentry.S the rest
 *   edgeprobe_rings.c     per-thread event rings (EDGEPROBE_TRACE)
 *   edgeprobe_args.c      fentry argument / return-value records (EP_CTL_ARGS)
 *   edgeprobe_forkexit.c  fork handlers, constructor, destructor and the
 *                         EDGEPROBE_OUTPUT dump
 *   this header           build attributes, limits, process-wide and
 *                         per-thread state, and the hot-path helpers every
 *                         hook inlines (clocks, slot addressing, function
 *                         lookup, shadow-stack push and pop), static inline
 *                         so that splitting the files changed no hook's code.
 *
 * Rules every file keeps (the host is a production process):
 *   - no locks, no malloc, no syscalls on the hook path once the calling
 *     thread has its slot (the first hit of a thread claims one: gettid and
 *     pthread_setspecific, no locks);
 *   - every hook is async-signal-safe: per-thread state carries a busy word
 *     (the stack position and return address of the running hook); a hook
 *     that interrupts another hook on the same thread is dropped and counted
 *     (ep_thread.reentrant_drops), and a busy word left by a hook a signal
 *     handler longjmp'd out of is recognised as stale and cleared
 *     (ep_thread.abandoned_hooks), so nothing stays blocked;
 *   - exits match entries by stack position (ep_frame.sp): frames a hook
 *     finds at or below its own position cannot be live and are counted
 *     unmatched (longjmp, exceptions, probes toggled mid-call), so the
 *     shadow stack heals at the next hook;
 *   - nothing here aborts the host;
 *   - nothing here is instrumented (no_instrument_function everywhere and the
 *     library is built without -finstrument-functions);
 *   - a failure to set up (no memory, no memfd_create, bad limits) disables recording,
 *     it never aborts the host;
 *   - names shared between files are hidden (EP_HIDDEN, EP_SHARED*): the
 *     library exports the hooks only (and prctl/syscall: edgeprobe_seccomp.c;
 *     swapcontext: edgeprobe_ctx.c).
 *
 * Every .c file includes this header first and ends by popping the
 * general-regs-only pragma it pushes.
 *
 * Build (see docs/runtime.md):
 *   cc -O2 -fPIC -shared -fno-plt -pthread -fvisibility=hidden \
 *      -ftls-model=initial-exec -Wall -Wextra runtime/edgeprobe_*.c runtime/edgeprobe_fentry.S \
 *      -o bin/libedgeprobe.so   (every .c and .S file under runtime/)
 */
#ifndef EDGEPROBE_INTERNAL_H
#define EDGEPROBE_INTERNAL_H

#define _GNU_SOURCE
#include "edgeprobe_shm.h"

#include <cpuid.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h> /* rename */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

/* Everything below is compiled for general-purpose registers only: the
 * compiler rejects any floating point and never uses an xmm register, so the
 * hooks leave the caller's vector registers alone. __fentry__ relies on it
 * (it saves no vector register on its fast path: the probed function's
 * xmm0-7 arguments are live), as does the return trampoline (xmm0/xmm1 hold
 * return values). Only calls into libc can touch vector state; the fentry
 * paths that make them (slot claim, region set-up) run behind a full xsave. */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("general-regs-only"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("general-regs-only")
#endif

#define EP_FN __attribute__((no_instrument_function))
#define EP_INLINE static inline __attribute__((no_instrument_function, always_inline))
#define EP_STATIC static __attribute__((no_instrument_function))
#define EP_COLD static __attribute__((no_instrument_function, noinline, cold))
#define EP_EXPORT __attribute__((visibility("default"), no_instrument_function))
/* Shared between the runtime's files: global but hidden (never exported,
 * whatever -fvisibility the library is built with). */
#define EP_HIDDEN __attribute__((visibility("hidden")))
#define EP_SHARED __attribute__((visibility("hidden"), no_instrument_function))
#define EP_SHARED_COLD __attribute__((visibility("hidden"), no_instrument_function, noinline, cold))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

#define LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)
/* Single-writer increment: a plain load and store, atomic per access so a
 * reader never sees a torn value, but no lock prefix. */
#define OWN_ADD(p, v) STORE((p), LOAD(p) + (v))
#define SIGFENCE() __atomic_signal_fence(__ATOMIC_SEQ_CST)

#define EP_NONE 0xffffffffu

/* ep_tls.busy outside hooks (constructor, fork handlers): never stale. */
#define EP_BUSY_HARD (~0ull)
/* Stack position of a hook: its frame address (using it makes the compiler
 * keep a frame pointer), i.e. the caller's stack pointer at the call - 16,
 * the same for the enter and the exit hook of one call; the hook's return
 * address is at EP_HERE() + 8 while it runs. */
#define EP_HERE() ((uint64_t)(uintptr_t)__builtin_frame_address(0))
/* Frames this far below a hook are checked against sigaltstack before they
 * are declared dead: a handler on an alternate stack above the thread's stack
 * must not kill the frames it interrupted. */
#define EP_NEAR_STACK (64u << 10)

/* Defaults and bounds of the configurable limits (docs/runtime.md). */
#define EP_DEF_FUNCS 16384u
#define EP_MAX_FUNCS_CAP (1u << 22)
#define EP_DEF_THREADS 1024u
#define EP_MAX_THREADS_CAP 65536u
#define EP_DEF_RING 512u
#define EP_MAX_RING_CAP (1u << 20)
#define EP_DEF_STACK 256u
#define EP_MAX_STACK_CAP 65536u
#define EP_DEF_LOCAL 64u
#define EP_MAX_LOCAL_CAP 4096u
#define EP_PROBE_LIMIT 32u
#define EP_LOCAL_PROBES 4u
#define EP_REGION_CAP (1ull << 36)

/* Sentinel values of ep_tls.slot below EP_SLOT_MIN. */
#define EP_TS_NONE ((struct ep_thread *)0)     /* not claimed yet */
#define EP_TS_DEAD ((struct ep_thread *)1)     /* released at thread exit */
#define EP_TS_OVERFLOW ((struct ep_thread *)2) /* no free slot */
#define EP_SLOT_MIN 16u

/* Process-wide state, read-only on the hook path after init. What the
 * hooks' fast paths read comes first: one cache line. */
struct ep_proc {
	struct ep_header *hdr;
	struct ep_func *funcs;
	uint64_t tsc_mult;
	uint32_t lmask;           /* local_funcs - 1 */
	/* stack_depth when the hooks' fast paths apply (a per-thread cache and
	 * the TSC as clock), else 0: one compare with the depth decides (D29) */
	uint32_t fast_depth;
	uint32_t stack_depth;
	uint32_t stack_off;
	uint32_t nlocal;          /* local_funcs */
	/* lmask << 6: masks key << 2 to the home entry's offset from the
	 * first entry, (key >> 4 & lmask) * 64, in one and (D98) */
	uint32_t lmask_off;
	char *base;               /* region */
	uint32_t fmask;           /* max_funcs - 1 */
	int tsc;                  /* 1: rdtsc, 0: clock_gettime */
	/* second line */
	uint32_t thread_size;
	uint32_t max_threads;
	uint32_t ring_mask;       /* ring_events - 1 */
	uint32_t ring_events;
	uint64_t ring_off;
	uint64_t ring_stride;
	uint64_t size;
};
/* Its symbol is named for the library (a static program links
 * libedgeprobe.a whole: a global of its own called "ep" must not clash). */
EP_HIDDEN extern struct ep_proc ep __asm__("edgeprobe_proc") __attribute__((aligned(64)));

/* Process-wide variables, defined in edgeprobe_region.c. */
EP_HIDDEN extern int ep_state;            /* init state machine: 0 none, 1 initialising, 2 ready, 3 failed */
EP_HIDDEN extern uint64_t ep_early_drops; /* drops before a header exists */
EP_HIDDEN extern pthread_key_t ep_key;    /* thread-exit destructor (ep_thread_dtor) */
EP_HIDDEN extern int ep_key_ok;
EP_HIDDEN extern int ep_fd;               /* the region's memfd, kept open; -1 when there is none */
EP_HIDDEN extern uint64_t ep_fd_dev, ep_fd_ino; /* that memfd's identity (the trap handler, D101) */
EP_HIDDEN extern int ep_forked;           /* this image is a fork child of the process that loaded us */
EP_HIDDEN extern char ep_out[4096];       /* EDGEPROBE_OUTPUT, %p expanded */
EP_HIDDEN extern int ep_region_pid;
EP_HIDDEN extern uint32_t ep_fx_mode;     /* EP_FENTRY_* for this process, set with the region */
EP_HIDDEN extern uint32_t ep_epoch;       /* fork generation: shadow frames of another epoch are orphans */

struct ep_rframe;
struct ep_tls {
	struct ep_thread *slot;
	/* Stack position of the hook running on this thread (0: none;
	 * EP_BUSY_HARD: constructor or fork handlers), and its return address,
	 * found at busy + 8 as long as that hook runs (ep_busy_live). */
	uint64_t busy;
	uint64_t busy_ret;
	/* ep_frames(slot) while slot is a claimed slot (set before it): the
	 * cyg hooks' assembly finds a frame from it in one add */
	uint64_t frames;
	uint64_t saved_busy, saved_ret; /* across fork */
	/* fentry return-address stack (edgeprobe_fentry.c) */
	struct ep_rframe *rs;
	uint32_t rs_n;
	uint32_t rs_cap;
	uint32_t rs_state; /* EP_RS_*: 0 not set up yet, on, off */
	/* Where the running context's return-stack entries and shadow frames
	 * begin (edgeprobe_ctx.c): set when a context parked by swapcontext
	 * resumes on this thread; what lies below belongs to contexts left
	 * without the interposer. Cold paths only. */
	uint32_t ctx_rs_base;
	uint32_t ctx_d_base;
};
/* Defined in edgeprobe_thread.c. */
extern __thread struct ep_tls ep_tls __attribute__((tls_model("initial-exec"), visibility("hidden")));

/* ---- functions shared between the files (definitions where named) ---- */

/* edgeprobe_region.c */
EP_SHARED uint64_t ep_env_u64(const char *name, uint64_t def, uint64_t max);
EP_SHARED char *ep_append(char *p, char *end, const char *s);
EP_SHARED char *ep_append_u(char *p, char *end, uint64_t v);
EP_SHARED void ep_say(const char *msg, int err);
EP_SHARED int ep_ensure_init(void);
EP_SHARED_COLD void ep_count_early_drop(void);
EP_SHARED uint32_t ep_gfind(uint64_t key, uint64_t h);

/* edgeprobe_thread.c */
EP_SHARED_COLD struct ep_thread *ep_claim(void);
EP_SHARED_COLD void ep_tid_learn(void);
EP_SHARED_COLD int ep_busy_live(struct ep_thread *th, uint64_t here);
EP_SHARED_COLD void ep_pop_unmatched(struct ep_thread *th, uint32_t from, uint32_t to);
EP_SHARED_COLD uint32_t ep_heal(struct ep_thread *th, uint32_t d, uint64_t sp, uint64_t site);
EP_SHARED_COLD void ep_exit_unframed(struct ep_thread *th, uint64_t key, int why);
EP_SHARED_COLD void ep_exit_slow(struct ep_thread *th, uint64_t key, uint64_t sp, uint64_t now);
EP_SHARED void ep_pop_to(struct ep_thread *th, uint32_t lo);
EP_SHARED int ep_enter_slow(struct ep_thread *th, uint64_t key, uint32_t ctl, uint64_t sp, uint64_t site, int mark);
EP_SHARED_COLD void ep_skip_exit(struct ep_thread *th, uint32_t k);
EP_SHARED_COLD uint32_t ep_filter_verdict(struct ep_thread *th, uint64_t cg);
EP_SHARED_COLD int ep_trace_held(struct ep_thread *th, uint32_t kind, uint64_t key, uint32_t depth, uint32_t gen);
EP_SHARED void ep_count_entry(struct ep_thread *th, uint64_t key, uint32_t ctl, int deep);
EP_SHARED void ep_thread_dtor(void *v);
/* edgeprobe_trap.c (D89): the SIGTRAP handler and its in-flight table */
EP_HIDDEN extern struct ep_inflight ep_inflight;
EP_SHARED void ep_trap_install(void);
EP_SHARED void ep_trap_forked(void);

/* edgeprobe_rings.c */
/* kg: the event's kind | the gen of the word that decided it << 32 (one
 * register: the traced hit pays for no more than before, D79) */
#define EP_KG(kind, gen) ((uint64_t)(kind) | (uint64_t)(gen) << 32)
EP_SHARED void ep_trace(struct ep_thread *th, uint64_t kg, uint64_t key);
EP_SHARED void ep_trace_ts(struct ep_thread *th, uint32_t kind, uint64_t key, uint64_t mono, uint32_t gen);
EP_SHARED_COLD void ep_trace_thread(struct ep_thread *th, pid_t tid);

/* edgeprobe_args.c (argument capture, EP_CTL_ARGS) */
EP_SHARED_COLD void ep_args_entry(struct ep_thread *th, uint64_t key, uint64_t h0, const uint64_t *gregs,
                                  const uint64_t *slot, const void *vsave);
EP_SHARED_COLD void ep_args_exit(struct ep_thread *th, uint64_t key, uint64_t h0, const uint64_t *rregs);

/* edgeprobe_seccomp.c: set once the program asked for a seccomp mode */
EP_HIDDEN extern int ep_nosys;
EP_SHARED_COLD int ep_seccomp_at_load(void);

/* edgeprobe_fentry.c */
EP_SHARED uint32_t ep_fentry_mode(void);
EP_SHARED void ep_rs_free(void);
/* A suspended context's return-stack entries (edgeprobe_ctx.c, D102): each
 * EP_RS_ENTRY bytes, parked on the context's own stack by swapcontext. */
#define EP_RS_ENTRY 32u
EP_SHARED_COLD uint32_t ep_rs_ctx_count(void);
EP_SHARED_COLD uint32_t ep_rs_ctx_park(void *out, uint32_t k, uint32_t dbase, uint32_t dtop);
EP_SHARED_COLD void ep_rs_ctx_giveup(struct ep_thread *th);
EP_SHARED_COLD void ep_rs_ctx_unpark(struct ep_thread *th, const void *in, uint32_t k, uint32_t dbase, int mode);

/* ---- clocks ---- */

/* System calls made inside hooks go through these instead of libc's
 * syscall(): glibc's wrapper stores a failure in the thread's errno, and a
 * hook must leave the probed program's errno as it found it (a failed
 * process_vm_readv of an unreadable char * would otherwise show EFAULT to
 * code that tests errno after the probed call). They return what the kernel
 * returns (-errno on failure) and call no libc. */
EP_INLINE long ep_sys1(long nr, long a) {
	long r;
	__asm__ volatile("syscall" : "=a"(r) : "a"(nr), "D"(a) : "rcx", "r11", "memory");
	return r;
}

EP_INLINE long ep_sys2(long nr, long a, long b) {
	long r;
	__asm__ volatile("syscall" : "=a"(r) : "a"(nr), "D"(a), "S"(b) : "rcx", "r11", "memory");
	return r;
}

EP_INLINE long ep_sys6(long nr, long a, long b, long c, long d, long e, long f) {
	long r;
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;
	__asm__ volatile("syscall"
			 : "=a"(r)
			 : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return r;
}

/* Read n bytes of our own memory at src into dst without faulting (an
 * unmapped or protected source fails instead); the bytes read, <= 0 on a
 * failure. errno is left alone. */
EP_INLINE long ep_self_read(void *dst, uint64_t src, size_t n) {
	struct iovec l = {dst, n}, r = {(void *)(uintptr_t)src, n};
	return ep_sys6(SYS_process_vm_readv, ep_sys1(SYS_getpid, 0), (long)&l, 1L, (long)&r, 1L, 0L);
}

/* Whether the hooks must make no system call (D56): the program asked for
 * seccomp through our interposers (ep_nosys), a thread was under seccomp
 * when the runtime was loaded, or a reader saw one (header.nosys, which
 * covers filters installed with raw syscall instructions or while the
 * runtime was injected). Each side is copied to the other: a reader learns
 * of the interposers' flag, and a fork child, which gets a region of its
 * own, keeps the flag. Once set, never cleared (filters cannot be removed).
 * A rare-path check: never on the hooks' fast paths. */
EP_INLINE int ep_sys_off(void) {
	struct ep_header *h = ep.hdr;
	if (__atomic_load_n(&ep_nosys, __ATOMIC_RELAXED)) {
		if (h && !__atomic_load_n(&h->nosys, __ATOMIC_RELAXED))
			__atomic_store_n(&h->nosys, 1, __ATOMIC_RELAXED);
		return 1;
	}
	if (h && __atomic_load_n(&h->nosys, __ATOMIC_RELAXED)) {
		__atomic_store_n(&ep_nosys, 1, __ATOMIC_RELAXED);
		return 1;
	}
	return 0;
}

/* A system call a hook leaves out under ep_sys_off, counted. */
EP_INLINE void ep_count_nosys(void) {
	if (ep.hdr)
		__atomic_fetch_add(&ep.hdr->nosys_skips, 1, __ATOMIC_RELAXED);
}

/* Whether the thread runs on its alternate signal stack; its bounds in
 * *ss then. errno is left alone. */
EP_INLINE int ep_on_altstack(stack_t *ss) {
	return ep_sys2(SYS_sigaltstack, 0, (long)ss) == 0 && (ss->ss_flags & SS_ONSTACK);
}

EP_INLINE uint64_t ep_mono_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

EP_INLINE uint64_t ep_ticks(void) {
	if (likely(ep.tsc))
		return __rdtsc();
	return ep_mono_ns();
}

EP_INLINE uint64_t ep_to_ns(uint64_t ticks) {
	return (uint64_t)(((unsigned __int128)ticks * ep.tsc_mult) >> 32);
}

/* ---- slots ---- */

EP_INLINE struct ep_thread *ep_slot(uint32_t i) {
	return (struct ep_thread *)(ep.base + ep.hdr->thread_off + (uint64_t)i * ep.thread_size);
}
EP_INLINE struct ep_local *ep_locals(struct ep_thread *th) {
	return (struct ep_local *)((char *)th + sizeof(struct ep_thread));
}
/* A frame's loff: where in the slot its cache entry l is (never 0). */
EP_INLINE uint32_t ep_loff(struct ep_local *l, struct ep_thread *th) {
	return (uint32_t)((char *)l - (char *)th);
}
EP_INLINE struct ep_local *ep_local_at(struct ep_thread *th, uint32_t loff) {
	return (struct ep_local *)((char *)th + loff);
}
/* A key's home in the thread's cache (D98): functions start at least 16
 * bytes apart, so neighbours get entries of their own; key << 2 masked
 * with lmask_off is the same entry's offset, which the hooks' assembly uses. */
EP_INLINE uint32_t ep_local_home(uint64_t key) { return (uint32_t)(key >> 4); }
EP_INLINE struct ep_frame *ep_frames(struct ep_thread *th) {
	return (struct ep_frame *)((char *)th + ep.stack_off);
}
EP_INLINE struct ep_event *ep_ring(struct ep_thread *th) {
	return (struct ep_event *)(ep.base + ep.ring_off + (uint64_t)th->index * ep.ring_stride);
}

/* ---- function lookup ---- */

/* ---- function table ---- */

EP_INLINE uint64_t ep_hash(uint64_t key) { return key * EP_HASH_MUL; }

/* The thread's cache entry for key, inserting it when there is room near its
 * home; NULL sends the caller to the shared counters. *gidx is set either way
 * (EP_NONE when the function table is full). */
EP_INLINE struct ep_local *ep_lookup(struct ep_thread *th, uint64_t key, uint32_t *gidx) {
	uint64_t h = ep_hash(key);
	if (likely(ep.nlocal)) {
		struct ep_local *loc = ep_locals(th);
		uint32_t i = ep_local_home(key);
		for (uint32_t p = 0; p < EP_LOCAL_PROBES; p++) {
			uint32_t li = (i + p) & ep.lmask;
			struct ep_local *l = &loc[li];
			uint64_t a = l->addr;
			if (likely(a == key)) {
				*gidx = l->gidx;
				return l;
			}
			if (a == 0) {
				uint32_t g = ep_gfind(key, h);
				*gidx = g;
				if (g == EP_NONE)
					return NULL;
				STORE(&l->gidx, g);
				STORE(&l->frame_ids, (uint64_t)g | (uint64_t)ep_loff(l, th) << 32);
				__atomic_store_n(&l->addr, key, __ATOMIC_RELEASE);
				return l;
			}
		}
		OWN_ADD(&th->local_full, 1);
	}
	*gidx = ep_gfind(key, h);
	return NULL;
}

/* ---- shadow stack: push and pop on the hook path ---- */

/* ---- hook bodies ---- */

EP_INLINE uint32_t ep_bucket(uint64_t ns) {
	uint32_t b = 63u - (uint32_t)__builtin_clzll(ns | 1);
	return likely(b < EP_HIST_BUCKETS) ? b : EP_HIST_BUCKETS - 1;
}

EP_INLINE void ep_record_minmax(struct ep_func *f, uint64_t ns) {
	uint64_t mx = LOAD(&f->max_ns);
	while (ns > mx && !__atomic_compare_exchange_n(&f->max_ns, &mx, ns, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
	uint64_t inv = ~ns, mi = LOAD(&f->min_inv);
	while (inv > mi && !__atomic_compare_exchange_n(&f->min_inv, &mi, inv, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
}

EP_INLINE void ep_record_latency(struct ep_func *f, uint64_t ns) {
	ADD(&f->hist[ep_bucket(ns)], 1);
	ep_record_minmax(f, ns);
}

/* The same, for a function counted in the thread's cache entry l (D30): the
 * bucket's address is taken from the entry's hint (the bucket of the
 * thread's last latency of that function), known long before the clock
 * read, and the hint checked by a branch. Addressed by the latency itself,
 * the add waits for the TSC read and everything after it in the program
 * waits for the add's address (measured: ~4 ns per timed hit, a plain add as
 * much as a locked one); a correctly predicted branch lets it go on. */
EP_INLINE void ep_record_latency_hinted(struct ep_func *f, struct ep_local *l, uint64_t ns) {
	uint32_t hb = l->hint;
	uint64_t *p = &f->hist[hb < EP_HIST_BUCKETS ? hb : 0];
	__asm__("" : "+r"(p)); /* keep the hinted address: the compiler must not rebuild it from b */
	uint32_t b = ep_bucket(ns);
	if (likely(b == hb)) {
		ADD(p, 1);
	} else {
		ADD(&f->hist[b], 1);
		l->hint = b;
	}
	ep_record_minmax(f, ns);
}

/* Pop (unmatched) every frame that can no longer be live, seen from an
 * enter hook at stack position sp called from site, on a thread at depth d;
 * returns the new depth. An enter hook runs below every live frame but those
 * of functions inlined into its caller (a callee's frame lies below its
 * caller's stack pointer; inlined callees call their hooks at the caller's
 * position), so a frame below its position belongs to a call that has left
 * without its exit: longjmp, an exception, an exit probe that was off. At
 * the same position, a frame entered from the same site is dead too (that
 * call site cannot be live twice at one position: the calls in a loop of a
 * function whose exit probe is off), and so is everything above it. A frame
 * far below sp is only dead if we are not on a signal stack above it (a
 * handler's hooks must not kill the frames it interrupted). Exits cannot
 * use position: gcc -O2 tail-calls the exit hook after the epilogue, above
 * the function's own enter position; they match by key (ep_exit_slow). */
EP_INLINE int ep_frame_dead(const struct ep_frame *fr, uint64_t sp) { return fr->sp < sp; }

/* Control bits that send every cyg hook to the general path (quotas: enters
 * must take one, and the hooks are sampled for the profiler's estimate). */
#define EP_CTL_SLOWPATH (EP_CTL_PAUSE | EP_CTL_TRACE | EP_CTL_QUOTA)

/* The process-wide generation (header.gen) stamped on a frame at its enter:
 * hotpatch sets a function's ep_func.gen to a new value of it just before
 * turning the function's probes on (D12, D29), so a frame is stale when its
 * function's generation is newer than its own. */
EP_INLINE uint32_t ep_gen_now(void) { return LOAD(&ep.hdr->gen); }
/* header.control (low half) and header.gen (high half) in one load: they
 * share an aligned 8-byte word (edgeprobe_shm.h keeps them together). */
EP_INLINE uint64_t ep_ctl_gen(void) { return LOAD((const uint64_t *)(const void *)&ep.hdr->control); }
_Static_assert(offsetof(struct ep_header, gen) == offsetof(struct ep_header, control) + 4 &&
                   offsetof(struct ep_header, control) % 8 == 0,
               "ep_ctl_gen reads control and gen as one aligned word");
_Static_assert(offsetof(struct ep_frame, flags) == offsetof(struct ep_frame, gen) + 4 &&
                   offsetof(struct ep_frame, gen) % 8 == 0,
               "ep_enter_fast writes gen and flags as one word");

EP_INLINE int ep_frame_stale(const struct ep_frame *fr) {
	return (int32_t)((uint32_t)LOAD(&ep.funcs[fr->gidx].gen) - fr->gen) > 0;
}

/* ---- trace filters (EP_CTL_FILTER, D32) ---- */

/* A call's event, unless a filter leaves it out; returns whether it went
 * to the ring. */
/* Whether a capture's depth and thread filters leave out this thread's
 * call at shadow-stack depth, under the control|gen word cg (D58): the
 * thread's kept verdict when it was made under cg, else a new one. */
EP_INLINE int ep_filter_out(struct ep_thread *th, uint64_t cg, uint32_t depth) {
	if (cg == th->filter_out_cg)
		return 1;
	uint32_t lim = cg == th->filter_lim_cg ? th->filter_lim : ep_filter_verdict(th, cg);
	return depth >= lim;
}

/* Test builds only (-DEP_TEST_PARK; internal/capture TestTraceStrayEvent):
 * a function of the program called once a hook has decided its event and
 * before it writes it, so that a test can hold a thread there while one
 * capture ends and the next starts. Never in the library users get. */
#ifdef EP_TEST_PARK
extern void edgeprobe_test_park(uint64_t key, uint32_t kind) __attribute__((weak));
#define EP_TEST_PARK_POINT(key, kind)                                                                              \
	do {                                                                                                       \
		if (edgeprobe_test_park)                                                                           \
			edgeprobe_test_park(key, kind);                                                            \
	} while (0)
#else
#define EP_TEST_PARK_POINT(key, kind) ((void)0)
#endif

/* A call's event under the control|gen word cg (D79): the filters are cg's
 * (its EP_CTL_FILTER bit, and the header's filter words read after it),
 * and the event is stamped with cg's gen, so that a capture can tell an
 * event decided under its own words from one decided under an earlier
 * capture's (a hook preempted across the switch writes it late). Returns
 * whether it went to the ring. */
EP_INLINE int ep_trace_cg(struct ep_thread *th, uint64_t cg, uint32_t kind, uint64_t key, uint32_t depth) {
	uint32_t gen = (uint32_t)(cg >> 32);
	if (unlikely((uint32_t)cg & EP_CTL_FILTER)) {
		if (ep_filter_out(th, cg, depth))
			return 0;
		if (LOAD(&ep.hdr->filter_min_ns))
			return ep_trace_held(th, kind, key, depth, gen);
	}
	EP_TEST_PARK_POINT(key, kind);
	ep_trace(th, EP_KG(kind, gen), key);
	return 1;
}

/* The event of a hook that read EP_CTL_TRACE in its control word ctl when
 * it began: judged and stamped under the word read now (ep_trace_cg), which
 * is the one a capture's filters are in force under. */
EP_INLINE int ep_trace_at(struct ep_thread *th, uint32_t ctl, uint32_t kind, uint64_t key, uint32_t depth) {
	(void)ctl;
	return ep_trace_cg(th, ep_ctl_gen(), kind, key, depth);
}

/* ---- quotas (EP_CTL_QUOTA, D31) ---- */

/* A frame pushed for a call its quota did not let record (gidx EP_NONE): its
 * exit records nothing, and it is never counted unmatched or open. */
EP_INLINE int ep_frame_skip(const struct ep_frame *fr) { return fr->gidx == EP_NONE; }

/* Take one of the function's quota_k calls of the current quota epoch:
 * 1 if this call may record, 0 if the quota is used up. Exact across
 * threads (CAS on one word per function); once the quota is used up, a call
 * costs a load and a compare. A new epoch starts at the first call that
 * finds the function's word of an older one. *taken: the epoch the call was
 * counted in. *busy is set to 1 before the CAS (whose lock orders it before
 * the take: a reader that sees the take sees the 1, D55) and back to 0 when
 * the quota is used up; the caller clears it otherwise. */
EP_INLINE int ep_quota_take(struct ep_func *f, uint32_t *taken, uint32_t *busy) {
	uint32_t epoch = LOAD(&ep.hdr->quota_epoch), k = LOAD(&ep.hdr->quota_k);
	uint64_t q = LOAD(&f->quota);
	int set = 0;
	for (;;) {
		/* A newer epoch in the word than the one we read means our read is
		 * stale (the reader moved on meanwhile): count in the word's. Only
		 * an older word starts over, so a late thread never resets a
		 * newer epoch's count. */
		uint64_t n = (int32_t)((uint32_t)(q >> 32) - epoch) >= 0 ? q : (uint64_t)epoch << 32;
		if ((uint32_t)n >= k) {
			if (set)
				STORE(busy, 0);
			return 0;
		}
		n++;
		if (!set) {
			STORE(busy, 1);
			set = 1;
		}
		if (__atomic_compare_exchange_n(&f->quota, &q, n, 1, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
			*taken = (uint32_t)(n >> 32);
			return 1;
		}
	}
}

/* Sampled timing of the hooks while quotas are on (the profiler's estimate
 * of its own cost, measured in the process): one hook in EP_HOOK_SAMPLE per
 * thread. Returns the start tick of a sampled hook, else 0. */
#define EP_HOOK_SAMPLE 64u
EP_INLINE uint64_t ep_sample_start(struct ep_thread *th, uint32_t ctl) {
	if (likely(!(ctl & EP_CTL_QUOTA)) || !ep.tsc)
		return 0;
	uint32_t left = th->sample_left;
	if (left) {
		th->sample_left = left - 1;
		return 0;
	}
	th->sample_left = EP_HOOK_SAMPLE - 1;
	return __rdtsc();
}
/* A sample longer than this many ticks was preempted or interrupted (no hook
 * takes microseconds): left out rather than let it swamp the mean. */
#define EP_SAMPLE_MAX_TICKS (1u << 16)
EP_INLINE void ep_sample_end(struct ep_thread *th, uint64_t t0) {
	if (unlikely(t0)) {
		uint64_t t1 = __rdtsc();
		if (t1 > t0 && t1 - t0 < EP_SAMPLE_MAX_TICKS) {
			OWN_ADD(&th->hook_ticks, t1 - t0);
			OWN_ADD(&th->hook_samples, 1);
		}
	}
}

/* The hot enter (D29): the function is in the thread's cache at its home
 * entry, the shadow stack has room and no frame needs healing; then push its
 * frame and return 1. Otherwise return 0 having written nothing: the caller
 * takes ep_enter_slow (first sight of a function, a cache collision,
 * healing, beyond the stack, no cache, no TSC), out of line so that the
 * hooks keep few registers live. gen: header.gen, read with the control
 * word. */
EP_INLINE int ep_enter_fast(struct ep_thread *th, uint64_t key, uint32_t ctl, uint32_t gen, uint64_t sp,
                            uint64_t site) {
	struct ep_local *l = ep_locals(th) + (ep_local_home(key) & ep.lmask);
	uint32_t d = th->depth;
	struct ep_frame *fr = ep_frames(th) + d;
	if (unlikely(d >= ep.fast_depth || l->addr != key || (d && fr[-1].sp <= sp)))
		return 0;
	OWN_ADD(&l->entries, 1);
	fr->fn = key;
	fr->sp = sp;
	fr->site = site;
	fr->gidx = l->gidx;
	fr->loff = ep_loff(l, th);
	uint64_t gen_flags = gen; /* gen, and flags 0: one store */
	__builtin_memcpy(&fr->gen, &gen_flags, sizeof gen_flags);
	fr->ts = (ctl & EP_CTL_NOTIME) ? 0 : __rdtsc();
	SIGFENCE();
	STORE(&th->depth, d + 1);
	return 1;
}

/* Any enter. Returns whether the thread's depth went up (a frame, stored or
 * beyond the stack, awaits its exit). mark: push a skip frame for a call its
 * quota does not let record (the exit hook will run anyway: cyg), rather
 * than nothing (fentry: then its exit is not probed). */
EP_INLINE int ep_enter(struct ep_thread *th, uint64_t key, uint32_t ctl, uint64_t sp, uint64_t site, int mark) {
	if (likely(!(ctl & EP_CTL_QUOTA) && ep_enter_fast(th, key, ctl, ep_gen_now(), sp, site))) {
		if (unlikely(ctl & EP_CTL_TRACE))
			ep_trace_at(th, ctl, EP_EV_ENTER, key, th->depth - 1);
		return 1;
	}
	return ep_enter_slow(th, key, ctl, sp, site, mark);
}

#define EP_UNFRAMED_ORPHAN 1 /* no frame: probes switched on mid-call, a fork child's inherited frames */
#define EP_UNFRAMED_DEEP 2   /* the exit of a frame deeper than the shadow stack */

/* The exit of the stored frame fr (already popped): count it and its latency. */
EP_INLINE void ep_exit_frame(struct ep_thread *th, struct ep_frame *fr, uint64_t now) {
	uint64_t ns = 0;
	int timed = now && fr->ts;
	if (timed)
		ns = now > fr->ts ? ep_to_ns(now - fr->ts) : 0;
	if (likely(fr->loff)) {
		struct ep_local *l = ep_local_at(th, fr->loff);
		OWN_ADD(&l->exits, 1);
		if (timed) {
			OWN_ADD(&l->sum_ns, ns);
			ep_record_latency_hinted(&ep.funcs[fr->gidx], l, ns);
		}
	} else {
		ADD(&ep.funcs[fr->gidx].exits, 1);
		if (timed) {
			ADD(&ep.funcs[fr->gidx].sum_ns, ns);
			ep_record_latency(&ep.funcs[fr->gidx], ns);
		}
	}
}

/* The hot exit (D29): the top frame is this function's, stored, counted in
 * the thread's cache, and its generation is the process's (nothing was
 * turned on since its enter; else ep_exit_slow compares it with the
 * function's). Returns 0 having written nothing otherwise. Like
 * ep_enter_fast, it applies only with a cache and the TSC (ep.fast_depth). */
EP_INLINE int ep_exit_fast(struct ep_thread *th, uint64_t key, uint32_t ctl, uint32_t gen) {
	uint32_t d = th->depth;
	struct ep_frame *fr = ep_frames(th) + d - 1;
	uint32_t loff = fr->loff;
	if (unlikely(d - 1 >= ep.fast_depth || fr->fn != key || fr->gen != gen || !loff))
		return 0;
	struct ep_local *l = ep_local_at(th, loff);
	STORE(&th->depth, d - 1);
	OWN_ADD(&l->exits, 1);
	if (!(ctl & EP_CTL_NOTIME) && fr->ts) {
		uint64_t now = __rdtsc(), ts = fr->ts;
		uint64_t ns = now > ts ? ep_to_ns(now - ts) : 0;
		OWN_ADD(&l->sum_ns, ns);
		ep_record_latency_hinted(&ep.funcs[fr->gidx], l, ns);
	}
	return 1;
}

EP_INLINE void ep_exit(struct ep_thread *th, uint64_t key, uint32_t ctl, uint64_t sp) {
	if (!ep_exit_fast(th, key, ctl, ep_gen_now())) {
		uint64_t now = (ctl & EP_CTL_NOTIME) ? 0 : ep_ticks();
		uint32_t d = th->depth;
		struct ep_frame *fr = ep_frames(th) + d - 1;
		if (d - 1 < ep.stack_depth && fr->fn == key && ep_frame_skip(fr)) {
			ep_skip_exit(th, d);
			return; /* nothing recorded, nothing traced */
		} else if (d - 1 < ep.stack_depth && fr->fn == key && !ep_frame_stale(fr)) {
			STORE(&th->depth, d - 1);
			ep_exit_frame(th, fr, now);
		} else {
			ep_exit_slow(th, key, sp, now);
		}
	}
	if (unlikely(ctl & EP_CTL_TRACE))
		ep_trace_at(th, ctl, EP_EV_EXIT, key, th->depth);
}

#endif /* EDGEPROBE_INTERNAL_H */
