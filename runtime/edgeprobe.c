/* edgeprobe.c: the LD_PRELOAD runtime behind edgeprobe's probes.
 *
 * It defines the -finstrument-functions hooks (__cyg_profile_func_enter/exit
 * and clang's __cyg_profile_func_enter_bare) and the -pg -mfentry hook
 * (__fentry__, in edgeprobe_fentry.S, whose exits are probed by hijacking the
 * return address; C halves in the "fentry provider" section) and records, per function
 * address, entries, exits and inclusive latency into a shared-memory region
 * (an anonymous memfd, "/memfd:edgeprobe" in /proc/<pid>/fd; layout in edgeprobe_shm.h, reader in
 * internal/shm, description in docs/runtime.md).
 *
 * Rules this file keeps (the host is a production process):
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
 *     it never aborts the host.
 *
 * Build (see docs/runtime.md):
 *   cc -O2 -fPIC -shared -fno-plt -pthread -fvisibility=hidden \
 *      -ftls-model=initial-exec -Wall -Wextra runtime/edgeprobe.c -o bin/libedgeprobe.so
 */
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

/* Process-wide state, read-only on the hook path after init. */
static struct {
	char *base;               /* region */
	struct ep_header *hdr;
	struct ep_func *funcs;
	uint32_t fmask;           /* max_funcs - 1 */
	uint32_t max_probe;
	uint32_t lmask;           /* local_funcs - 1 */
	uint32_t nlocal;          /* local_funcs */
	uint32_t stack_depth;
	uint32_t stack_off;
	uint32_t thread_size;
	uint32_t max_threads;
	uint32_t ring_mask;       /* ring_events - 1 */
	uint32_t ring_events;
	uint64_t ring_off;
	uint64_t ring_stride;
	uint64_t tsc_mult;
	int tsc;                  /* 1: rdtsc, 0: clock_gettime */
	uint64_t size;
} ep __attribute__((aligned(64)));

/* Init state machine: 0 none, 1 initialising, 2 ready, 3 failed. */
static int ep_state;
static uint64_t ep_early_drops; /* drops before a header exists */
static int ep_calibrated;
static uint64_t ep_cal_mult, ep_cal_tsc0, ep_cal_mono0, ep_cal_real0, ep_cal_ns;
static int ep_clock_is_tsc;
static pthread_key_t ep_key;
static int ep_key_ok;
static int ep_atfork_done;
/* The region's memfd, kept open: hotpatch finds the region as the
 * process's "/memfd:edgeprobe" descriptor (/proc/PID/fd), which takes the
 * same rights as ptrace. -1 when there is none. */
static int ep_fd = -1;
static int ep_forked; /* this image is a fork child of the process that loaded us */
static char ep_out[4096];
static int ep_region_pid;
static uint32_t ep_fx_mode;  /* EP_FENTRY_* for this process, set with the region */
static uint32_t ep_epoch;    /* fork generation: shadow frames of another epoch are orphans */

struct ep_rframe;
struct ep_tls {
	struct ep_thread *slot;
	/* Stack position of the hook running on this thread (0: none;
	 * EP_BUSY_HARD: constructor or fork handlers), and its return address,
	 * found at busy + 8 as long as that hook runs (ep_busy_live). */
	uint64_t busy;
	uint64_t busy_ret;
	uint64_t saved_busy, saved_ret; /* across fork */
	/* fentry return-address stack (see the fentry provider section) */
	struct ep_rframe *rs;
	uint32_t rs_n;
	uint32_t rs_cap;
	uint32_t rs_state; /* EP_RS_*: 0 not set up yet, on, off */
};
static __thread struct ep_tls ep_tls __attribute__((tls_model("initial-exec")));

/* ---- clocks ---- */

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

EP_STATIC int ep_invariant_tsc(void) {
	unsigned a, b, c, d;
	if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000007u)
		return 0;
	__get_cpuid(0x80000007u, &a, &b, &c, &d);
	return (d >> 8) & 1;
}

EP_STATIC int ep_streq(const char *a, const char *b) {
	while (*a && *a == *b)
		a++, b++;
	return *a == *b;
}

/* Calibrate the TSC against CLOCK_MONOTONIC over ~500us (once per process
 * tree: a fork child keeps its parent's figures). */
EP_STATIC void ep_calibrate(void) {
	if (ep_calibrated)
		return;
	const char *c = getenv("EDGEPROBE_CLOCK");
	int tsc = ep_invariant_tsc();
	if (c && ep_streq(c, "mono"))
		tsc = 0;
	else if (c && ep_streq(c, "tsc"))
		tsc = 1;
	struct timespec rt;
	if (tsc) {
		uint64_t a = __rdtsc(), m0 = ep_mono_ns(), b = __rdtsc();
		uint64_t t0 = a + (b - a) / 2, t1, m1;
		do {
			a = __rdtsc();
			m1 = ep_mono_ns();
			b = __rdtsc();
			t1 = a + (b - a) / 2;
		} while (m1 - m0 < 500000);
		if (t1 <= t0) {
			tsc = 0;
		} else {
			ep_cal_mult = (uint64_t)((((unsigned __int128)(m1 - m0)) << 32) / (t1 - t0));
			ep_cal_tsc0 = t1;
			ep_cal_mono0 = m1;
			ep_cal_ns = m1 - m0;
		}
	}
	if (!tsc) {
		ep_cal_mult = 1ull << 32;
		ep_cal_mono0 = ep_mono_ns();
		ep_cal_tsc0 = ep_cal_mono0;
		ep_cal_ns = 0;
	}
	clock_gettime(CLOCK_REALTIME, &rt);
	ep_cal_real0 = (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec;
	ep_clock_is_tsc = tsc;
	ep_calibrated = 1;
}

/* ---- small helpers (no stdio: async-signal-safe) ---- */

EP_STATIC uint64_t ep_env_u64(const char *name, uint64_t def, uint64_t max) {
	const char *s = getenv(name);
	if (!s || !*s)
		return def;
	uint64_t v = 0;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return def;
		v = v * 10 + (uint64_t)(*s - '0');
		if (v > max)
			return max;
	}
	return v;
}

EP_STATIC uint32_t ep_pow2(uint64_t v) {
	uint32_t p = 1;
	while (p < v)
		p <<= 1;
	return p;
}

EP_STATIC char *ep_append(char *p, char *end, const char *s) {
	while (*s && p < end)
		*p++ = *s++;
	return p;
}

EP_STATIC char *ep_append_u(char *p, char *end, uint64_t v) {
	char tmp[24];
	int n = 0;
	do
		tmp[n++] = (char)('0' + v % 10);
	while ((v /= 10) && n < 24);
	while (n && p < end)
		*p++ = tmp[--n];
	return p;
}

EP_STATIC void ep_say(const char *msg, int err) {
	if (getenv("EDGEPROBE_QUIET"))
		return;
	char buf[512], *p = buf, *end = buf + sizeof buf - 2;
	p = ep_append(p, end, "edgeprobe: ");
	p = ep_append(p, end, msg);
	if (err) {
		p = ep_append(p, end, " (errno ");
		p = ep_append_u(p, end, (uint64_t)err);
		p = ep_append(p, end, ")");
	}
	p = ep_append(p, end, "; recording disabled\n");
	ssize_t r = write(2, buf, (size_t)(p - buf));
	(void)r;
}

EP_INLINE struct ep_thread *ep_slot(uint32_t i) {
	return (struct ep_thread *)(ep.base + ep.hdr->thread_off + (uint64_t)i * ep.thread_size);
}
EP_INLINE struct ep_local *ep_locals(struct ep_thread *th) {
	return (struct ep_local *)((char *)th + sizeof(struct ep_thread));
}
EP_INLINE struct ep_frame *ep_frames(struct ep_thread *th) {
	return (struct ep_frame *)((char *)th + ep.stack_off);
}
EP_INLINE struct ep_event *ep_ring(struct ep_thread *th) {
	return (struct ep_event *)(ep.base + ep.ring_off + (uint64_t)th->index * ep.ring_stride);
}

/* ---- region ---- */

EP_STATIC void ep_thread_dtor(void *v);
EP_STATIC uint32_t ep_fentry_mode(void);
EP_STATIC void ep_rs_free(void);
EP_STATIC void ep_atfork_prepare(void);
EP_STATIC void ep_atfork_parent(void);
EP_STATIC void ep_atfork_child(void);

EP_STATIC int ep_make_region(void) {
	uint32_t nf = ep_pow2(ep_env_u64("EDGEPROBE_MAX_FUNCS", EP_DEF_FUNCS, EP_MAX_FUNCS_CAP));
	uint32_t nt = (uint32_t)ep_env_u64("EDGEPROBE_MAX_THREADS", EP_DEF_THREADS, EP_MAX_THREADS_CAP);
	uint64_t re = ep_env_u64("EDGEPROBE_RING_EVENTS", EP_DEF_RING, EP_MAX_RING_CAP);
	uint32_t nr = re ? ep_pow2(re) : 0;
	uint32_t sd = (uint32_t)ep_env_u64("EDGEPROBE_STACK_DEPTH", EP_DEF_STACK, EP_MAX_STACK_CAP);
	uint64_t lo = ep_env_u64("EDGEPROBE_LOCAL_FUNCS", EP_DEF_LOCAL, EP_MAX_LOCAL_CAP);
	uint32_t nl = lo ? ep_pow2(lo) : 0;
	if (nt == 0)
		nt = 1;
	if (sd == 0)
		sd = 1;

	uint64_t local_bytes = (uint64_t)nl * sizeof(struct ep_local);
	uint64_t stack_off = (sizeof(struct ep_thread) + local_bytes + 63) & ~63ull;
	uint64_t tsize = (stack_off + (uint64_t)sd * sizeof(struct ep_frame) + 63) & ~63ull;
	uint64_t rstride = ((uint64_t)nr * sizeof(struct ep_event) + 63) & ~63ull;
	uint64_t func_off = EP_HEADER_SIZE;
	uint64_t thread_off = func_off + (uint64_t)nf * sizeof(struct ep_func);
	uint64_t ring_off = thread_off + (uint64_t)nt * tsize;
	uint64_t size = ring_off + (uint64_t)nt * rstride;
	size = (size + 4095) & ~4095ull;
	if (size > EP_REGION_CAP || tsize > 0xffffffffull) {
		ep_say("limits give a region that is too large", 0);
		return -1;
	}

	ep_calibrate();

	pid_t pid = getpid();
	/* An anonymous memory file (D16): no name anyone else can plant, read
	 * or truncate; the kernel frees it with the last mapping and descriptor,
	 * however the process ends (exit, _exit, SIGKILL, exec: MFD_CLOEXEC). */
	int fd = (int)syscall(SYS_memfd_create, "edgeprobe", 1u /* MFD_CLOEXEC */);
	if (fd < 0) {
		ep_say("cannot create the shared-memory file (memfd_create)", errno);
		return -1;
	}
	if (ftruncate(fd, (off_t)size) != 0) {
		ep_say("cannot size the shared-memory file", errno);
		goto fail;
	}
	/* Pay for what is used: a memfd has no size limit of its own, so its
	 * untouched pages cost nothing and a later page fault can only meet
	 * the memory limits any allocation meets (no SIGBUS from a full
	 * /dev/shm any more). EDGEPROBE_RESERVE=1 allocates every page now. */
	if (ep_env_u64("EDGEPROBE_RESERVE", 0, 1)) {
		int e = posix_fallocate(fd, 0, (off_t)size);
		if (e != 0 && e != EOPNOTSUPP && e != ENOSYS && e != EINVAL) {
			ep_say("cannot reserve the shared-memory file", e);
			goto fail;
		}
	}
	void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		ep_say("cannot map the shared-memory file", errno);
		goto fail;
	}

	struct ep_header *h = m;
	h->version = EP_VERSION;
	h->header_size = EP_HEADER_SIZE;
	h->region_size = size;
	h->pid = pid;
	h->ppid = getppid();
	h->hist_buckets = EP_HIST_BUCKETS;
	h->clock_kind = ep_clock_is_tsc ? EP_CLOCK_TSC : EP_CLOCK_MONO;
	h->tsc_mult = ep_cal_mult;
	h->tsc0 = ep_cal_tsc0;
	h->mono0 = ep_cal_mono0;
	h->real0 = ep_cal_real0;
	h->func_off = func_off;
	h->max_funcs = nf;
	h->func_size = sizeof(struct ep_func);
	h->thread_off = thread_off;
	h->max_threads = nt;
	h->thread_size = (uint32_t)tsize;
	h->thread_local_off = sizeof(struct ep_thread);
	h->local_funcs = nl;
	h->local_size = sizeof(struct ep_local);
	h->thread_stack_off = (uint32_t)stack_off;
	h->stack_depth = sd;
	h->frame_size = sizeof(struct ep_frame);
	h->ring_off = ring_off;
	h->ring_stride = rstride;
	h->ring_events = nr;
	h->event_size = sizeof(struct ep_event);
	h->max_probe = nf < EP_PROBE_LIMIT ? nf : EP_PROBE_LIMIT;
	h->calib_ns = ep_cal_ns;
	h->init_mono = ep_mono_ns();
	h->state = EP_STATE_RUNNING;
	uint32_t ctl = 0;
	if (ep_env_u64("EDGEPROBE_TRACE", 0, 1))
		ctl |= EP_CTL_TRACE;
	if (!ep_env_u64("EDGEPROBE_TIMING", 1, 1))
		ctl |= EP_CTL_NOTIME;
	h->control = ctl;
	h->preinit_drops = LOAD(&ep_early_drops);
	ep_fx_mode = ep_fentry_mode();
	h->fentry_mode = ep_fx_mode;

	ep.base = m;
	ep.hdr = h;
	ep.funcs = (struct ep_func *)((char *)m + func_off);
	ep.fmask = nf - 1;
	ep.max_probe = h->max_probe;
	ep.nlocal = nl;
	ep.lmask = nl ? nl - 1 : 0;
	ep.stack_depth = sd;
	ep.stack_off = (uint32_t)stack_off;
	ep.thread_size = (uint32_t)tsize;
	ep.max_threads = nt;
	ep.ring_events = nr;
	ep.ring_mask = nr ? nr - 1 : 0;
	ep.ring_off = ring_off;
	ep.ring_stride = rstride;
	ep.tsc_mult = ep_cal_mult;
	ep.tsc = ep_clock_is_tsc;
	ep.size = size;
	ep_region_pid = pid;

	/* Publish: magic last (a reader may find the descriptor before). */
	__atomic_store_n(&h->magic, EP_MAGIC, __ATOMIC_RELEASE);
	ep_fd = fd;

	const char *out = getenv("EDGEPROBE_OUTPUT");
	ep_out[0] = 0;
	if (out && *out) {
		char *p = ep_out, *oend = ep_out + sizeof ep_out - 24;
		int subst = 0;
		for (const char *s = out; *s && p < oend; s++) {
			if (s[0] == '%' && s[1] == 'p') {
				p = ep_append_u(p, oend, (uint64_t)pid);
				s++;
				subst = 1;
			} else {
				*p++ = *s;
			}
		}
		if (ep_forked && !subst) {
			p = ep_append(p, oend, ".");
			p = ep_append_u(p, oend, (uint64_t)pid);
		}
		*p = 0;
	}
	if (!ep_key_ok) {
		if (pthread_key_create(&ep_key, ep_thread_dtor) == 0)
			ep_key_ok = 1;
	}
	return 0;
fail:
	close(fd);
	return -1;
}

/* Returns 1 once the region is ready; 0 while another thread sets it up or
 * when setting up failed. Safe from any hook: the busy flag of the calling
 * thread is already set, so a signal cannot re-enter it on this thread. */
EP_STATIC int ep_ensure_init(void) {
	int s = __atomic_load_n(&ep_state, __ATOMIC_ACQUIRE);
	if (likely(s == 2))
		return 1;
	if (s == 0) {
		int z = 0;
		if (__atomic_compare_exchange_n(&ep_state, &z, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
			int ok = ep_make_region() == 0;
			__atomic_store_n(&ep_state, ok ? 2 : 3, __ATOMIC_RELEASE);
			return ok;
		}
	}
	return 0;
}

EP_COLD void ep_count_early_drop(void) {
	if (__atomic_load_n(&ep_state, __ATOMIC_ACQUIRE) == 2)
		ADD(&ep.hdr->preinit_drops, 1);
	else
		ADD(&ep_early_drops, 1);
}

/* Slow path of the first hook a thread runs (and of threads without a slot). */
EP_COLD int ep_busy_live(struct ep_thread *th, uint64_t here);

EP_COLD struct ep_thread *ep_claim(void) {
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
	struct ep_thread *got = NULL;
	if (!ep_ensure_init()) {
		ep_count_early_drop();
		goto out;
	}
	pid_t tid = (pid_t)syscall(SYS_gettid);
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
	STORE(&got->claimed_mono, ep_mono_ns());
	ADD(&ep.hdr->threads_claimed, 1);
	ADD(&ep.hdr->threads_active, 1);
	if (ep_key_ok)
		pthread_setspecific(ep_key, got);
	ep_tls.slot = got;
	if ((LOAD(&ep.hdr->control) & EP_CTL_TRACE) && ep.ring_events) {
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
out:
	SIGFENCE();
	ep_tls.busy = 0;
	return got;
}

/* ---- function table ---- */

EP_INLINE uint64_t ep_hash(uint64_t key) { return key * 0x9E3779B97F4A7C15ull; }

/* Find (or insert) key in the shared table; EP_NONE when it is full within
 * max_probe slots of the key's home. Insertion is one CAS on the key. */
EP_STATIC uint32_t ep_gfind(uint64_t key, uint64_t h) {
	uint32_t i = (uint32_t)(h >> 32);
	for (uint32_t p = 0; p < ep.max_probe; p++) {
		uint32_t j = (i + p) & ep.fmask;
		struct ep_func *f = &ep.funcs[j];
		uint64_t a = LOAD(&f->addr);
		if (a == key)
			return j;
		if (a == 0) {
			if (__atomic_compare_exchange_n(&f->addr, &a, key, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
				ADD(&ep.hdr->funcs_used, 1);
				return j;
			}
			if (a == key)
				return j;
		}
	}
	return EP_NONE;
}

/* The thread's cache entry for key, inserting it when there is room near its
 * home; NULL sends the caller to the shared counters. *gidx is set either way
 * (EP_NONE when the function table is full). */
EP_INLINE struct ep_local *ep_lookup(struct ep_thread *th, uint64_t key, uint32_t *gidx) {
	uint64_t h = ep_hash(key);
	if (likely(ep.nlocal)) {
		struct ep_local *loc = ep_locals(th);
		uint32_t i = (uint32_t)(h >> 40);
		for (uint32_t p = 0; p < EP_LOCAL_PROBES; p++) {
			struct ep_local *l = &loc[(i + p) & ep.lmask];
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
				__atomic_store_n(&l->addr, key, __ATOMIC_RELEASE);
				return l;
			}
		}
		OWN_ADD(&th->local_full, 1);
	}
	*gidx = ep_gfind(key, h);
	return NULL;
}

/* ---- events ---- */

EP_STATIC void ep_trace(struct ep_thread *th, uint32_t kind, uint64_t key) {
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

/* ---- hook bodies ---- */

EP_INLINE void ep_record_latency(struct ep_func *f, uint64_t ns) {
	uint32_t b = 63u - (uint32_t)__builtin_clzll(ns | 1);
	if (unlikely(b >= EP_HIST_BUCKETS))
		b = EP_HIST_BUCKETS - 1;
	ADD(&f->hist[b], 1);
	uint64_t mx = LOAD(&f->max_ns);
	while (ns > mx && !__atomic_compare_exchange_n(&f->max_ns, &mx, ns, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
	uint64_t inv = ~ns, mi = LOAD(&f->min_inv);
	while (inv > mi && !__atomic_compare_exchange_n(&f->min_inv, &mi, inv, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
}

/* Read a word of our own memory that may no longer be mapped (a stack left
 * behind); 0 when it cannot be read. A system call: rare paths only. */
EP_STATIC uint64_t ep_peek(uint64_t a) {
	uint64_t v = 0;
	struct iovec l = {&v, sizeof v}, r = {(void *)(uintptr_t)a, sizeof v};
	if (syscall(SYS_process_vm_readv, (long)getpid(), &l, 1L, &r, 1L, 0L) != (long)sizeof v)
		return 0;
	return v;
}

/* Whether the hook named by the busy word still runs: a signal handler
 * interrupted it and we are a hook of that handler (drop us), rather than a
 * handler having longjmp'd out of it (then the word is stale: clear it,
 * count the abandoned hook, go on). A running hook's return address is at
 * busy + 8; an abandoned one's frame has been left and, once we run at or
 * above it or anything has been called over it, no longer holds it. */
EP_COLD int ep_busy_live(struct ep_thread *th, uint64_t here) {
	uint64_t b = ep_tls.busy;
	if (b == EP_BUSY_HARD)
		return 1;
	uint64_t got;
	if (here < b && b - here < (1u << 20))
		got = *(volatile uint64_t *)(uintptr_t)(b + 8); /* above us on this stack: mapped */
	else
		got = ep_peek(b + 8);
	/* A hook that interrupts a live one on the same stack runs below it
	 * (a signal frame is pushed under the interrupted one). At or above the
	 * busy frame we can only be a later hook on a stack the abandoned one
	 * left: a loop calling the same function from the same place rebuilds
	 * that frame with the same return address, which alone would make a
	 * stale word look live forever. A handler on an alternate signal stack
	 * may run anywhere: there only the return address can tell. */
	int above = here >= b;
	if (above) {
		stack_t ss;
		if (sigaltstack(NULL, &ss) == 0 && (ss.ss_flags & SS_ONSTACK))
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

/* Count the stored frames [to, from) unmatched, popping from the top. */
EP_COLD void ep_pop_unmatched(struct ep_thread *th, uint32_t from, uint32_t to) {
	struct ep_frame *fr = ep_frames(th);
	for (uint32_t j = from; j > to; j--) {
		ADD(&ep.funcs[fr[j - 1].gidx].unmatched, 1);
		OWN_ADD(&th->unmatched, 1);
	}
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

EP_COLD uint32_t ep_heal(struct ep_thread *th, uint32_t d, uint64_t sp, uint64_t site) {
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
		if (sigaltstack(NULL, &ss) == 0 && (ss.ss_flags & SS_ONSTACK)) {
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
		ADD(&ep.funcs[fr[i - 1].gidx].unmatched, 1);
		OWN_ADD(&th->unmatched, 1);
	}
	return j;
}

EP_INLINE void ep_enter(struct ep_thread *th, uint64_t key, uint32_t ctl, uint64_t sp, uint64_t site) {
	uint32_t g;
	struct ep_local *l = ep_lookup(th, key, &g);
	if (unlikely(g == EP_NONE)) {
		ADD(&ep.hdr->func_drop_enters, 1);
		return;
	}
	if (likely(l != NULL))
		OWN_ADD(&l->entries, 1);
	else
		ADD(&ep.funcs[g].entries, 1);
	uint32_t d = th->depth;
	uint32_t top = d < ep.stack_depth ? d : ep.stack_depth;
	if (unlikely(top && ep_frames(th)[top - 1].sp <= sp))
		d = ep_heal(th, d, sp, site);
	if (likely(d < ep.stack_depth)) {
		struct ep_frame *fr = ep_frames(th) + d;
		fr->fn = key;
		fr->sp = sp;
		fr->site = site;
		fr->gidx = g;
		fr->lidx = l ? (uint32_t)(l - ep_locals(th)) + 1 : 0;
		fr->gen = (uint32_t)LOAD(&ep.funcs[g].gen);
		fr->ts = (ctl & EP_CTL_NOTIME) ? 0 : ep_ticks();
	} else {
		/* deeper than the shadow stack: counted, untimed; its exit is
		 * matched by nesting (ep_exit_slow) */
		OWN_ADD(&th->stack_overflows, 1);
		ADD(&ep.funcs[g].deep_entries, 1);
	}
	SIGFENCE();
	STORE(&th->depth, d + 1);
	if (unlikely(ctl & EP_CTL_TRACE))
		ep_trace(th, EP_EV_ENTER, key);
}

#define EP_UNFRAMED_ORPHAN 1 /* no frame: probes switched on mid-call, a fork child's inherited frames */
#define EP_UNFRAMED_DEEP 2   /* the exit of a frame deeper than the shadow stack */

/* An exit with no frame to match it: counted, untimed, with its reason. */
EP_COLD void ep_exit_unframed(struct ep_thread *th, uint64_t key, int why) {
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

/* The exit of the stored frame fr (already popped): count it and its latency. */
EP_INLINE void ep_exit_frame(struct ep_thread *th, struct ep_frame *fr, uint64_t now) {
	uint64_t ns = 0;
	int timed = now && fr->ts;
	if (timed)
		ns = now > fr->ts ? ep_to_ns(now - fr->ts) : 0;
	if (likely(fr->lidx)) {
		struct ep_local *l = ep_locals(th) + fr->lidx - 1;
		OWN_ADD(&l->exits, 1);
		if (timed)
			OWN_ADD(&l->sum_ns, ns);
	} else {
		ADD(&ep.funcs[fr->gidx].exits, 1);
		if (timed)
			ADD(&ep.funcs[fr->gidx].sum_ns, ns);
	}
	if (timed)
		ep_record_latency(&ep.funcs[fr->gidx], ns);
}

/* Everything but "the top frame is this call's": beyond the shadow stack,
 * then match by key (the newest frame of the function: frames above it lost
 * their exits), then by generation. */
EP_COLD void ep_exit_slow(struct ep_thread *th, uint64_t key, uint64_t sp, uint64_t now) {
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
	STORE(&th->depth, k - 1);
	if (unlikely(fr->gen != (uint32_t)LOAD(&ep.funcs[fr->gidx].gen))) {
		/* pushed before the probes were last turned on: that call's exit was
		 * missed and this exit belongs to a call entered unseen */
		ep_pop_unmatched(th, k, k - 1);
		ep_exit_unframed(th, key, EP_UNFRAMED_ORPHAN);
		return;
	}
	ep_exit_frame(th, fr, now);
}

EP_INLINE void ep_exit(struct ep_thread *th, uint64_t key, uint32_t ctl, uint64_t sp) {
	uint64_t now = (ctl & EP_CTL_NOTIME) ? 0 : ep_ticks();
	uint32_t d = th->depth;
	struct ep_frame *fr = ep_frames(th) + d - 1;
	if (likely(d - 1 < ep.stack_depth && fr->fn == key && fr->gen == (uint32_t)LOAD(&ep.funcs[fr->gidx].gen))) {
		STORE(&th->depth, d - 1);
		ep_exit_frame(th, fr, now);
	} else {
		ep_exit_slow(th, key, sp, now);
	}
	if (unlikely(ctl & EP_CTL_TRACE))
		ep_trace(th, EP_EV_EXIT, key);
}

/* Entry without an exit probe: count (and trace) it, push nothing. deep: it
 * would have had one, but the return-address stack is full. */
EP_STATIC void ep_count_entry(struct ep_thread *th, uint64_t key, uint32_t ctl, int deep) {
	uint32_t g;
	struct ep_local *l = ep_lookup(th, key, &g);
	if (g == EP_NONE) {
		ADD(&ep.hdr->func_drop_enters, 1);
		return;
	}
	if (l)
		OWN_ADD(&l->entries, 1);
	else
		ADD(&ep.funcs[g].entries, 1);
	if (deep)
		ADD(&ep.funcs[g].deep_entries, 1);
	if (ctl & EP_CTL_TRACE)
		ep_trace(th, EP_EV_ENTER, key);
}

/* What a cyg hook does once it may record. */
enum { EP_HOOK_ENTER, EP_HOOK_EXIT, EP_HOOK_COUNT };

/* The body of every cyg hook; inlined into each with what a constant, here
 * its frame address and ret its return address. */
EP_INLINE void ep_cyg_hook(uint64_t key, int what, uint64_t here, uint64_t ret) {
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
	if (what == EP_HOOK_EXIT)
		ep_exit(th, key, ctl, here);
	else if (what == EP_HOOK_ENTER)
		ep_enter(th, key, ctl, here, ret);
	else
		ep_count_entry(th, key, ctl, 0);
	SIGFENCE();
	ep_tls.busy = 0;
}

EP_EXPORT void __cyg_profile_func_enter(void *fn, void *site) {
	(void)site;
	ep_cyg_hook((uint64_t)(uintptr_t)fn, EP_HOOK_ENTER, EP_HERE(), (uint64_t)(uintptr_t)__builtin_return_address(0));
}

EP_EXPORT void __cyg_profile_func_exit(void *fn, void *site) {
	(void)site;
	ep_cyg_hook((uint64_t)(uintptr_t)fn, EP_HOOK_EXIT, EP_HERE(), (uint64_t)(uintptr_t)__builtin_return_address(0));
}

/* clang -finstrument-function-entry-bare: no address and no exit. Counted as
 * an entry keyed by the return address (inside the instrumented function)
 * with EP_KEY_BARE set; the reader resolves it by containment. */
EP_EXPORT void __cyg_profile_func_enter_bare(void) {
	uint64_t ret = (uint64_t)(uintptr_t)__builtin_return_address(0);
	ep_cyg_hook(ret | EP_KEY_BARE, EP_HOOK_COUNT, EP_HERE(), ret);
}

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
	if (syscall(SYS_arch_prctl, 0x5005, &features) == 0)
		return (features & 1) != 0; /* ARCH_SHSTK_SHSTK */
	return 0;
}

EP_STATIC uint32_t ep_fentry_mode(void) {
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
EP_COLD void ep_rs_init(void) {
	static int said;
	uint32_t m = LOAD(&ep_fx_mode);
	ep_tls.rs_state = EP_RS_OFF;
	if ((m & EP_FENTRY_SHSTK) || ((m & EP_FENTRY_EXITS) && ep_shstk_on())) {
		/* A return-address swap would fault on the shadow stack's check. */
		__atomic_fetch_or(&ep.hdr->fentry_mode, EP_FENTRY_SHSTK, __ATOMIC_RELAXED);
		if (!(m & EP_FENTRY_EXITS_OFF) && !__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
			ep_say_line("CET user shadow stack is on: fentry exit probes refused, counting entries only");
		return;
	}
	if (!(m & EP_FENTRY_EXITS))
		return;
	size_t bytes = ((size_t)ep.stack_depth * sizeof(struct ep_rframe) + 4095) & ~(size_t)4095;
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return;
	ep_tls.rs = p;
	ep_tls.rs_cap = ep.stack_depth;
	ep_tls.rs_n = 0;
	ep_tls.rs_state = EP_RS_ON;
}

EP_STATIC void ep_rs_free(void) {
	struct ep_rframe *rs = ep_tls.rs;
	uint32_t cap = ep_tls.rs_cap;
	ep_tls.rs_state = EP_RS_OFF;
	ep_tls.rs_n = 0;
	ep_tls.rs = NULL;
	SIGFENCE();
	if (rs)
		munmap(rs, ((size_t)cap * sizeof(struct ep_rframe) + 4095) & ~(size_t)4095);
}

/* ---- sites ---- */

/* Whether [a, a+n) is readable: the bytes before a function may lie on an
 * unmapped page (only checked when they are on another page than the call). */
EP_STATIC int ep_readable(uint64_t a, uint64_t call) {
	if ((a >> 12) == (call >> 12))
		return 1;
	char buf[16];
	struct iovec l = {buf, (size_t)(call - a)}, r = {(void *)(uintptr_t)a, (size_t)(call - a)};
	return syscall(SYS_process_vm_readv, (long)getpid(), &l, 1L, &r, 1L, 0L) == (long)(call - a);
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
	if (p[-5] == 0xe8 || p[-5] == 0x3d) {
		call = ret - 5;
		if (ep_readable(ret - 10, call) && p[-6] == 0x67 && ep_is_endbr64(p - 10))
			return ret - 10;
	} else if (p[-6] == 0xff && p[-5] == 0x15) {
		call = ret - 6;
	} else {
		return ret | EP_KEY_BARE;
	}
	uint64_t flag = 0;
	if (ep_readable(call - 6, call)) {
		const uint8_t *c = (const uint8_t *)(uintptr_t)call;
		if (c[-2] == 0x41 && c[-1] == 0x52 && p[0] == 0x41 && p[1] == 0x5a) {
			call -= 2;
			flag = EP_SITE_R10;
		}
	}
	if (ep_readable(call - 4, call) && ep_is_endbr64((const uint8_t *)(uintptr_t)(call - 4)))
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

/* Pop the shadow frames at depth >= lo: those stored counted unmatched, those
 * deeper than the shadow stack counted lost (their functions are unknown). */
EP_STATIC void ep_pop_to(struct ep_thread *th, uint32_t lo) {
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
	if (unlikely(fr->fn != key)) {
		ep_exit_unframed(th, key, EP_UNFRAMED_ORPHAN);
		goto trace;
	}
	if (unlikely(fr->gen != (uint32_t)LOAD(&ep.funcs[fr->gidx].gen))) {
		ep_pop_unmatched(th, d + 1, d);
		ep_exit_unframed(th, key, EP_UNFRAMED_ORPHAN);
		goto trace;
	}
	ep_exit_frame(th, fr, now);
trace:
	if (unlikely(ctl & EP_CTL_TRACE))
		ep_trace(th, EP_EV_EXIT, key);
}

EP_INLINE void ep_fentry_record_exit(struct ep_thread *th, const struct ep_rframe *f, uint32_t ctl) {
	if (likely(f->epoch == ep_epoch)) {
		ep_exit_at(th, f->key, f->d, ctl);
	} else {
		/* pushed before fork, in the parent's region */
		ep_exit_unframed(th, f->key, EP_UNFRAMED_ORPHAN);
		if (ctl & EP_CTL_TRACE)
			ep_trace(th, EP_EV_EXIT, f->key);
	}
}

/* Forget return-stack entry f, whose frame is dead. If its slot lies below
 * our own stack pointer (free stack, or another stack) and still holds the
 * trampoline, give the original return address back: should the frame be
 * alive after all (a coroutine's stack), it returns normally, unmeasured.
 * Slots between our stack pointer and the current slot hold our own frames
 * now: that frame is certainly dead. */
EP_STATIC void ep_rs_forget(struct ep_thread *th, const struct ep_rframe *f, uint64_t mysp) {
	uint64_t *slot = (uint64_t *)(uintptr_t)f->slot;
	if (f->slot < mysp && LOAD(slot) == EP_TRAMP) {
		STORE(slot, f->ret);
		OWN_ADD(&th->fentry_restored, 1);
	}
}

/* Count the shadow frames of dead return-stack entries [n, old_n) unmatched. */
EP_STATIC void ep_rs_drop(struct ep_thread *th, uint32_t n, uint32_t old_n, uint64_t mysp) {
	uint32_t dmin = EP_NONE;
	for (uint32_t i = n; i < old_n; i++) {
		if (ep_tls.rs[i].epoch == ep_epoch && ep_tls.rs[i].d < dmin)
			dmin = ep_tls.rs[i].d;
		ep_rs_forget(th, &ep_tls.rs[i], mysp);
	}
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
		if (sigaltstack(NULL, &ss) == 0 && (ss.ss_flags & SS_ONSTACK)) {
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

EP_INLINE int ep_fentry_enter_impl(uint64_t ret, uint64_t *slotp, int may_slow, uint64_t here, uint64_t hret) {
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
	uint64_t key = ep_site_key(ret);
	if (unlikely(key & EP_SITE_R10)) {
		key &= ~EP_SITE_R10;
		slotp++;
	}
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
			uint32_t d = th->depth;
			ep_enter(th, key, ctl, slot, ret);
			if (likely(th->depth > 0)) { /* recorded: probe the exit */
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
			(void)d;
		}
	} else {
		ep_count_entry(th, key, ctl, 0);
	}
	SIGFENCE();
	ep_tls.busy = 0;
	return 0;
}

/* Called by __fentry__ with xmm0-7 saved: must not call into libc. Returns 1
 * for the slow path (the caller saves the whole vector state first). */
__attribute__((visibility("hidden"), no_instrument_function)) int ep_fentry_enter(uint64_t ret, uint64_t *slotp) {
	return ep_fentry_enter_impl(ret, slotp, 1, EP_HERE(), (uint64_t)(uintptr_t)__builtin_return_address(0));
}

__attribute__((visibility("hidden"), no_instrument_function, cold)) void ep_fentry_enter_slow(uint64_t ret, uint64_t *slotp) {
	uint64_t here = EP_HERE(), hret = (uint64_t)(uintptr_t)__builtin_return_address(0);
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
	ep_fentry_enter_impl(ret, slotp, 0, here, hret);
}

/* A return through a slot with no entry cannot happen: an entry leaves the
 * stack only when its frame returns, when its slot is given back
 * (ep_rs_forget), or when our own frames have overwritten the slot. Should
 * it happen all the same there is no address to return to; say so and stop
 * with a trap rather than jump anywhere. */
EP_COLD void ep_fentry_lost(uint64_t slot) {
	char buf[160], *p = buf, *end = buf + sizeof buf - 2;
	p = ep_append(p, end, "edgeprobe: fentry return through an unknown frame (slot 0x");
	for (int i = 60; i >= 0; i -= 4)
		*p++ = "0123456789abcdef"[(slot >> i) & 15];
	p = ep_append(p, end, "): the return address is lost\n");
	ssize_t r = write(2, buf, (size_t)(p - buf));
	(void)r;
	__builtin_trap();
}

/* The return-stack entry of the frame returning through slot: the newest
 * entry with that slot. */
EP_COLD uint32_t ep_fentry_find(uint64_t slot) {
	uint32_t n = ep_tls.rs_n;
	for (uint32_t i = n; i > 0; i--)
		if (ep_tls.rs[i - 1].slot == slot)
			return i - 1;
	ep_fentry_lost(slot);
	return 0;
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
	for (uint32_t j = i + 1; j < n; j++) {
		if (rs[j].slot > slot) {
			rs[w++] = rs[j];
			continue;
		}
		if (th && rs[j].epoch == ep_epoch && rs[j].d < dmin)
			dmin = rs[j].d;
		if (th)
			ep_rs_forget(th, &rs[j], mysp);
		else if (rs[j].slot < mysp && LOAD((uint64_t *)(uintptr_t)rs[j].slot) == EP_TRAMP)
			STORE((uint64_t *)(uintptr_t)rs[j].slot, rs[j].ret);
	}
	if (th && dmin != EP_NONE && dmin > rs[i].d)
		ep_pop_to(th, dmin);
	return w;
}

EP_INLINE struct ep_ret2 ep_fentry_exit_impl(uint64_t sp, int may_slow, uint64_t here, uint64_t hret) {
	uint64_t slot = sp - 8;
	struct ep_rframe *rs = ep_tls.rs;
	uint32_t n = ep_tls.rs_n, i;
	if (likely(n && rs && rs[n - 1].slot == slot))
		i = n - 1;
	else
		i = ep_fentry_find(slot);
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
	ep_tls.rs_n = likely(i + 1 == n) ? i : ep_rs_unlink(th, i, n, here);
	if (likely(!(ctl & EP_CTL_PAUSE)))
		ep_fentry_record_exit(th, &f, ctl);
	SIGFENCE();
	ep_tls.busy = 0;
	return r;
}

/* Called by ep_fentry_return with rax, rdx, xmm0, xmm1 saved (no libc). */
__attribute__((visibility("hidden"), no_instrument_function)) struct ep_ret2 ep_fentry_exit(uint64_t sp) {
	return ep_fentry_exit_impl(sp, 1, EP_HERE(), (uint64_t)(uintptr_t)__builtin_return_address(0));
}

__attribute__((visibility("hidden"), no_instrument_function, cold)) uint64_t ep_fentry_exit_slow(uint64_t sp) {
	if (ep_tls.slot == EP_TS_NONE)
		ep_claim();
	return ep_fentry_exit_impl(sp, 0, EP_HERE(), (uint64_t)(uintptr_t)__builtin_return_address(0)).ret;
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

/* ---- thread exit, fork, process exit ---- */

EP_STATIC void ep_thread_dtor(void *v) {
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

/* Hooks on the forking thread between prepare and the child/parent handlers
 * are dropped (counted as reentrant), so the child never writes the parent's
 * region. */
EP_STATIC void ep_atfork_prepare(void) {
	ep_tls.saved_busy = ep_tls.busy;
	ep_tls.saved_ret = ep_tls.busy_ret;
	ep_tls.busy = EP_BUSY_HARD;
	SIGFENCE();
}

EP_STATIC void ep_atfork_parent(void) {
	ep_tls.busy_ret = ep_tls.saved_ret;
	SIGFENCE();
	ep_tls.busy = ep_tls.saved_busy;
}

/* The child gets its own region, made lazily at its first hook: drop the
 * inherited mapping (it is the parent's), forget the parent's slot. Frames
 * the thread was inside at fork() exit as orphans in the child. */
EP_STATIC void ep_atfork_child(void) {
	/* Order matters for a signal arriving here: forget the slot and the
	 * region before unmapping it. */
	ep_tls.slot = EP_TS_NONE;
	SIGFENCE();
	int had = __atomic_exchange_n(&ep_state, 0, __ATOMIC_ACQ_REL) == 2;
	SIGFENCE();
	ep_early_drops = 0;
	ep_forked = 1;
	/* The fentry return-address stack (TLS pointer, private mapping) is
	 * copied with the process and stays valid: the child returns through its
	 * inherited hijacked frames; their exits count as orphans in its region. */
	ep_epoch++;
	if (had) {
		munmap(ep.base, ep.size);
		memset(&ep, 0, sizeof ep);
	}
	/* the parent's descriptor: the child's region gets its own */
	if (ep_fd >= 0) {
		close(ep_fd);
		ep_fd = -1;
	}
	if (ep_key_ok)
		pthread_setspecific(ep_key, NULL);
	ep_tls.busy_ret = ep_tls.saved_ret;
	SIGFENCE();
	ep_tls.busy = ep_tls.saved_busy;
}

EP_STATIC int ep_page_zero(const char *p, size_t n) {
	const uint64_t *q = (const uint64_t *)p;
	for (size_t i = 0; i < n / 8; i++)
		if (q[i])
			return 0;
	return 1;
}

/* Write the region (zero pages as holes) and a copy of /proc/self/maps to
 * ep_out via a temporary file and rename. */
EP_STATIC void ep_write_output(void) {
	/* A fresh temporary beside the output (O_EXCL | O_NOFOLLOW: never a file
	 * or symlink someone planted), renamed over it: rename replaces a
	 * planted symlink itself, it does not follow it. */
	char tmp[sizeof ep_out + 64], *end = tmp + sizeof tmp - 1;
	int fd = -1;
	for (int attempt = 0; attempt < 16 && fd < 0; attempt++) {
		char *p = ep_append(tmp, end, ep_out);
		p = ep_append(p, end, ".tmp.");
		p = ep_append_u(p, end, (uint64_t)getpid());
		p = ep_append(p, end, ".");
		*ep_append_u(p, end, (__rdtsc() >> 4) & 0xffffff) = 0;
		fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd < 0 && errno != EEXIST)
			break;
	}
	if (fd < 0) {
		ep_say("cannot write EDGEPROBE_OUTPUT", errno);
		return;
	}
	int ok = 1;
	const size_t chunk = 4096;
	for (uint64_t off = EP_HEADER_SIZE; off < ep.size && ok; off += chunk) {
		size_t n = ep.size - off < chunk ? (size_t)(ep.size - off) : chunk;
		if (ep_page_zero(ep.base + off, n))
			continue;
		for (size_t done = 0; done < n;) {
			ssize_t w = pwrite(fd, ep.base + off + done, n - done, (off_t)(off + done));
			if (w <= 0) {
				if (w < 0 && errno == EINTR)
					continue;
				ok = 0;
				break;
			}
			done += (size_t)w;
		}
	}
	uint64_t mlen = 0;
	int mfd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (mfd >= 0) {
		char buf[4096];
		for (;;) {
			ssize_t r = read(mfd, buf, sizeof buf);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0)
				break;
			if (pwrite(fd, buf, (size_t)r, (off_t)(ep.size + mlen)) != r) {
				ok = 0;
				break;
			}
			mlen += (uint64_t)r;
		}
		close(mfd);
	}
	if (ftruncate(fd, (off_t)(ep.size + mlen)) != 0)
		ok = 0;
	struct ep_header hcopy;
	memcpy(&hcopy, ep.hdr, sizeof hcopy);
	hcopy.maps_off = mlen ? ep.size : 0;
	hcopy.maps_len = mlen;
	if (pwrite(fd, &hcopy, sizeof hcopy, 0) != (ssize_t)sizeof hcopy)
		ok = 0;
	if (close(fd) != 0)
		ok = 0;
	if (!ok || rename(tmp, ep_out) != 0) {
		ep_say("cannot write EDGEPROBE_OUTPUT", errno);
		unlink(tmp);
	}
}

__attribute__((constructor, no_instrument_function)) static void ep_ctor(void) {
	ep_tls.busy = EP_BUSY_HARD;
	SIGFENCE();
	ep_ensure_init();
	if (!ep_atfork_done && pthread_atfork(ep_atfork_prepare, ep_atfork_parent, ep_atfork_child) == 0)
		ep_atfork_done = 1;
	SIGFENCE();
	ep_tls.busy = 0;
}

/* Runs on return from main and on exit(); not on _exit() or a fatal signal
 * (the kernel frees the memfd then; only EDGEPROBE_OUTPUT is lost). The
 * mapping stays: hooks that run later (other destructors) keep counting
 * into it. */
__attribute__((destructor, no_instrument_function)) static void ep_dtor(void) {
	if (__atomic_load_n(&ep_state, __ATOMIC_ACQUIRE) != 2 || ep_region_pid != getpid())
		return;
	uint64_t saved = ep_tls.busy;
	ep_tls.busy = EP_BUSY_HARD;
	SIGFENCE();
	STORE(&ep.hdr->exit_tsc, ep.tsc ? __rdtsc() : ep_mono_ns());
	STORE(&ep.hdr->exit_mono, ep_mono_ns());
	__atomic_store_n(&ep.hdr->state, EP_STATE_EXITED, __ATOMIC_RELEASE);
	if (ep_out[0])
		ep_write_output();
	SIGFENCE();
	ep_tls.busy = saved;
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
