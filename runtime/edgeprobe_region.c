/* edgeprobe_region.c: the region and the function table.
 *
 * Owns the process-wide state (ep, the init state machine, the memfd, the
 * EDGEPROBE_OUTPUT path), the limits read from the environment, the clock
 * calibration, the making of the region (memfd, header, layout; D16) and the
 * shared function table's find-or-insert (ep_gfind).
 *
 * Locking: none. The region is made once, by the thread that wins the CAS on
 * ep_state (others drop their hooks until it is published: magic last, with
 * release order). ep_gfind inserts a key with one CAS and is called from hooks:
 * async-signal-safe, no libc. The making of the region calls libc (getenv,
 * memfd_create, mmap) and runs only under a set busy word (constructor, slot
 * claim), behind a full xsave on the fentry paths.
 */
#include "edgeprobe_internal.h"

struct ep_proc ep __attribute__((aligned(64)));

/* Init state machine: 0 none, 1 initialising, 2 ready, 3 failed. */
EP_HIDDEN int ep_state;
EP_HIDDEN uint64_t ep_early_drops; /* drops before a header exists */
static int ep_calibrated;
static uint64_t ep_cal_mult, ep_cal_tsc0, ep_cal_mono0, ep_cal_real0, ep_cal_ns;
static int ep_clock_is_tsc;
EP_HIDDEN pthread_key_t ep_key;
EP_HIDDEN int ep_key_ok;
/* The region's memfd, kept open: hotpatch finds the region as the
 * process's "/memfd:edgeprobe" descriptor (/proc/PID/fd), which takes the
 * same rights as ptrace. -1 when there is none. */
EP_HIDDEN int ep_fd = -1;
EP_HIDDEN uint64_t ep_fd_dev, ep_fd_ino;
EP_HIDDEN int ep_forked; /* this image is a fork child of the process that loaded us */
EP_HIDDEN char ep_out[4096];
EP_HIDDEN int ep_region_pid;
EP_HIDDEN uint32_t ep_fx_mode;  /* EP_FENTRY_* for this process, set with the region */
EP_HIDDEN uint32_t ep_epoch;    /* fork generation: shadow frames of another epoch are orphans */

/* ---- clocks ---- */

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

/* One reading of both clocks: the TSC at the middle of the tightest of a
 * few rdtsc brackets around a CLOCK_MONOTONIC read. A bracket the thread
 * was preempted or interrupted in is wide and its middle can be far from
 * the mono read: over a 500 us calibration, a 2 us error is 0.4% on every
 * latency (measured under load before this: recorded latencies 0.45-0.7%
 * below what the program measured of itself, TestLatencyBounds). */
EP_STATIC void ep_clock_pair(uint64_t *tsc, uint64_t *mono) {
	uint64_t best = ~0ull;
	for (int i = 0; i < 16; i++) {
		uint64_t a = __rdtsc(), m = ep_mono_ns(), b = __rdtsc();
		if (b >= a && b - a < best) {
			best = b - a;
			*tsc = a + (b - a) / 2;
			*mono = m;
		}
		if (best < 200 && i >= 3)
			break;
	}
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
		uint64_t t0 = 0, m0 = 0, t1 = 0, m1 = 0;
		ep_clock_pair(&t0, &m0);
		do
			ep_clock_pair(&t1, &m1);
		while (m1 - m0 < 500000);
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

EP_SHARED uint64_t ep_env_u64(const char *name, uint64_t def, uint64_t max) {
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

EP_SHARED char *ep_append(char *p, char *end, const char *s) {
	while (*s && p < end)
		*p++ = *s++;
	return p;
}

EP_SHARED char *ep_append_u(char *p, char *end, uint64_t v) {
	char tmp[24];
	int n = 0;
	do
		tmp[n++] = (char)('0' + v % 10);
	while ((v /= 10) && n < 24);
	while (n && p < end)
		*p++ = tmp[--n];
	return p;
}

EP_SHARED void ep_say(const char *msg, int err) {
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

/* Virtual space the rings may reserve (all threads): 1 GiB is 65,536 events
 * per ring at the default 1024 threads; EDGEPROBE_RING_MAX sets it instead. */
#define EP_RING_BUDGET (1ull << 30)

/* The function table's state for ep_gfind (the layout is in edgeprobe_shm.h). */
static uint64_t *ep_keys;     /* keys[max_funcs] */
static uint32_t ep_ffirst;    /* slots of segment 0 */
static uint32_t ep_fprobe;    /* max_probe */
static uint32_t ep_fsegs_max; /* segments up to max_funcs */

EP_STATIC uint32_t ep_log2(uint32_t v) { return 31u - (uint32_t)__builtin_clz(v); }

/* The region's geometry for a table of nf slots (the cap) whose first
 * segment has nf0: the fixed part (header, thread slots, rings), then the
 * keys, then the counters, each 64-byte aligned; a whole number of pages. */
struct ep_geom {
	uint64_t thread_off, ring_off, keys_off, func_off, size;
};

EP_STATIC struct ep_geom ep_geometry(uint32_t nf, uint32_t nt, uint64_t tsize, uint64_t rstride) {
	struct ep_geom g;
	g.thread_off = EP_HEADER_SIZE;
	g.ring_off = g.thread_off + (uint64_t)nt * tsize;
	g.keys_off = (g.ring_off + (uint64_t)nt * rstride + 63) & ~63ull;
	g.func_off = (g.keys_off + (uint64_t)nf * sizeof(uint64_t) + 63) & ~63ull;
	g.size = (g.func_off + (uint64_t)nf * sizeof(struct ep_func) + 4095) & ~4095ull;
	return g;
}

/* One step towards a smaller region: the rings' reserve goes first (rings
 * of the start size, no capture-time growth), then the function table's cap
 * is halved down to its first segment. 0 when nothing is left to give up. */
EP_STATIC int ep_shrink(uint32_t *nr, uint32_t rdef, uint32_t *nf, uint32_t nf0, uint64_t *rstride) {
	if (*nr > rdef) {
		*nr = rdef;
		*rstride = ((uint64_t)*nr * sizeof(struct ep_event) + 63) & ~63ull;
		return 1;
	}
	if (*nf > nf0) {
		*nf >>= 1;
		return 1;
	}
	return 0;
}

EP_STATIC int ep_make_region(void) {
	/* Under seccomp (D56) making the region takes system calls the filter
	 * may kill the program for (memfd_create, ftruncate, mmap, ...): run
	 * unrecorded instead. Known from the interposers, from the parent (a
	 * fork child), or found now, at load (an injected runtime, a fork
	 * child of a program sandboxed with raw syscall instructions). */
	if (__atomic_load_n(&ep_nosys, __ATOMIC_RELAXED) || ep_seccomp_at_load()) {
		__atomic_store_n(&ep_nosys, 1, __ATOMIC_RELAXED);
		return -1;
	}
	ep_tid_learn();
	/* The function table's cap and first segment (D35): the cap only
	 * reserves address space (untouched pages of a memfd cost nothing), so
	 * it defaults to the largest; the first segment is what a program of
	 * up to ~15,000 functions finds its keys in at the first probe. */
	uint32_t nf = ep_pow2(ep_env_u64("EDGEPROBE_MAX_FUNCS", EP_MAX_FUNCS_CAP, EP_MAX_FUNCS_CAP));
	uint32_t nf0 = ep_pow2(ep_env_u64("EDGEPROBE_FIRST_FUNCS", EP_DEF_FUNCS, EP_MAX_FUNCS_CAP));
	uint32_t nt = (uint32_t)ep_env_u64("EDGEPROBE_MAX_THREADS", EP_DEF_THREADS, EP_MAX_THREADS_CAP);
	uint64_t re = ep_env_u64("EDGEPROBE_RING_EVENTS", EP_DEF_RING, EP_MAX_RING_CAP);
	uint32_t rdef = re ? ep_pow2(re) : 0; /* the size rings start with */
	uint32_t sd = (uint32_t)ep_env_u64("EDGEPROBE_STACK_DEPTH", EP_DEF_STACK, EP_MAX_STACK_CAP);
	uint64_t lo = ep_env_u64("EDGEPROBE_LOCAL_FUNCS", EP_DEF_LOCAL, EP_MAX_LOCAL_CAP);
	uint32_t nl = lo ? ep_pow2(lo) : 0;
	if (nt == 0)
		nt = 1;
	if (sd == 0)
		sd = 1;
	/* Ring capacity: what a capture may ask for (--ring-events) without a
	 * restart. Reserved, not committed: a memfd page costs memory only once
	 * written, and a ring writes only its first ring_size cells. */
	uint32_t nr = 0;
	if (rdef) {
		uint64_t rmax = ep_env_u64("EDGEPROBE_RING_MAX", 0, EP_MAX_RING_CAP);
		if (rmax) {
			nr = ep_pow2(rmax);
		} else if (ep_env_u64("EDGEPROBE_RESERVE", 0, 1)) {
			nr = rdef; /* everything allocated up front: no reserve beyond it */
		} else {
			nr = EP_MAX_RING_CAP;
			while (nr > rdef && (uint64_t)nr * sizeof(struct ep_event) * nt > EP_RING_BUDGET)
				nr >>= 1;
		}
		if (nr < rdef)
			nr = rdef;
	}
	if (nf0 > nf)
		nf0 = nf;

	uint64_t local_bytes = (uint64_t)nl * sizeof(struct ep_local);
	uint64_t stack_off = (sizeof(struct ep_thread) + local_bytes + 63) & ~63ull;
	uint64_t tsize = (stack_off + (uint64_t)sd * sizeof(struct ep_frame) + 63) & ~63ull;
	uint64_t rstride = ((uint64_t)nr * sizeof(struct ep_event) + 63) & ~63ull;
	struct ep_geom g = ep_geometry(nf, nt, tsize, rstride);
	if (g.size > EP_REGION_CAP || tsize > 0xffffffffull) {
		ep_say("limits give a region that is too large", 0);
		return -1;
	}
	uint64_t thread_off = g.thread_off, ring_off = g.ring_off;
	uint64_t size = g.size;

	ep_calibrate();

	pid_t pid = getpid();
	/* An anonymous memory file (D16): no name anyone else can plant, read
	 * or truncate; the kernel frees it with the last mapping and descriptor,
	 * however the process ends (exit, _exit, SIGKILL, exec: MFD_CLOEXEC). */
	int fd = (int)syscall(SYS_memfd_create, "edgeprobe", 1u /* MFD_CLOEXEC */ | 2u /* MFD_ALLOW_SEALING */);
	if (fd < 0) {
		ep_say("cannot create the shared-memory file (memfd_create)", errno);
		return -1;
	}
	/* Address space for the whole cap and the rings' reserve, and a file
	 * no larger than RLIMIT_FSIZE (`ulimit -f` applies to a memfd too: an
	 * ftruncate past it raises SIGXFSZ, whose default action kills the
	 * program before main). Where either is limited, a smaller region
	 * rather than none (ep_shrink); if even the smallest is too large for
	 * the file-size limit, run unrecorded. */
	struct rlimit fl;
	uint64_t flimit = UINT64_MAX;
	if (getrlimit(RLIMIT_FSIZE, &fl) == 0 && fl.rlim_cur != RLIM_INFINITY)
		flimit = (uint64_t)fl.rlim_cur;
	void *m = MAP_FAILED;
	for (;;) {
		if (size <= flimit) {
			if (ftruncate(fd, (off_t)size) != 0) {
				ep_say("cannot size the shared-memory file", errno);
				goto fail;
			}
			m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
			if (m != MAP_FAILED || errno != ENOMEM)
				break;
		}
		if (!ep_shrink(&nr, rdef, &nf, nf0, &rstride)) {
			if (size > flimit) {
				ep_say("the file-size limit (ulimit -f) is below the region's size", 0);
				goto fail;
			}
			break; /* m is MAP_FAILED with errno ENOMEM */
		}
		g = ep_geometry(nf, nt, tsize, rstride);
		thread_off = g.thread_off;
		ring_off = g.ring_off;
		size = g.size;
	}
	if (m == MAP_FAILED) {
		ep_say("cannot map the shared-memory file", errno);
		goto fail;
	}
	/* Sealed against shrinking, and the seals against change: a reader
	 * maps the region at its size (hotpatch, often as root, in another
	 * user's process), and a truncation by anyone would make its next
	 * read a SIGBUS, which kills it. hotpatch maps only a region so
	 * sealed. (The program itself could truncate the file before.) */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
		ep_say("cannot seal the shared-memory file", errno);
		munmap(m, size);
		goto fail;
	}
	/* A core dump reads every page of a shared mapping (and makes shmem
	 * allocate the untouched ones): the table's reserve beyond its first
	 * segment, up to 2.4 GiB, stays out of core dumps. */
	if (nf > nf0) {
		uint64_t k0 = (g.keys_off + (uint64_t)nf0 * sizeof(uint64_t) + 4095) & ~4095ull;
		uint64_t f0 = (g.func_off + (uint64_t)nf0 * sizeof(struct ep_func) + 4095) & ~4095ull;
		uint64_t fk = g.func_off & ~4095ull; /* the keys' end shares a page with the counters' start */
		if (fk > k0)
			madvise((char *)m + k0, fk - k0, MADV_DONTDUMP);
		if (size > f0)
			madvise((char *)m + f0, size - f0, MADV_DONTDUMP);
	}
	/* Pay for what is used: a memfd has no size limit of its own, so its
	 * untouched pages cost nothing and a later page fault can only meet
	 * the memory limits any allocation meets (no SIGBUS from a full
	 * /dev/shm any more). EDGEPROBE_RESERVE=1 allocates the fixed part and
	 * the function table's first segment now (the later segments are
	 * address space until a program needs them). */
	if (ep_env_u64("EDGEPROBE_RESERVE", 0, 1)) {
		int e = posix_fallocate(fd, 0, (off_t)g.keys_off);
		if (e == 0)
			e = posix_fallocate(fd, (off_t)g.keys_off, (off_t)nf0 * (off_t)sizeof(uint64_t));
		if (e == 0)
			e = posix_fallocate(fd, (off_t)g.func_off, (off_t)nf0 * (off_t)sizeof(struct ep_func));
		if (e != 0 && e != EOPNOTSUPP && e != ENOSYS && e != EINVAL) {
			ep_say("cannot reserve the shared-memory file", e);
			munmap(m, size);
			goto fail;
		}
	}
	if (nr > rdef) {
		/* A core dump would read every reserved ring page (and make shmem
		 * allocate it): the rings stay out of core dumps. */
		uint64_t lo = (ring_off + 4095) & ~4095ull, hi = g.keys_off & ~4095ull;
		if (hi > lo)
			madvise((char *)m + lo, hi - lo, MADV_DONTDUMP);
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
	h->func_off = g.func_off;
	h->max_funcs = nf;
	h->keys_off = g.keys_off;
	h->func_first = nf0;
	h->func_segs = 1;
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
	h->ring_def = rdef;
	h->ring_req = rdef;
	h->event_size = sizeof(struct ep_event);
	h->max_probe = nf0 < EP_PROBE_LIMIT ? nf0 : EP_PROBE_LIMIT;
	h->calib_ns = ep_cal_ns;
	h->init_mono = ep_mono_ns();
	h->state = EP_STATE_RUNNING;
	/* version 8 (D89): where hotpatch lists the sites it puts an int3 on */
	h->inflight = (uint64_t)(uintptr_t)&ep_inflight;
	h->inflight_max = EP_INFLIGHT_MAX;
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
	ep.funcs = (struct ep_func *)((char *)m + g.func_off);
	ep.fmask = nf0 - 1;
	ep_keys = (uint64_t *)((char *)m + g.keys_off);
	ep_ffirst = nf0;
	ep_fprobe = h->max_probe;
	ep_fsegs_max = ep_log2(nf / nf0) + 1;
	ep.nlocal = nl;
	ep.lmask = nl ? nl - 1 : 0;
	ep.lmask_off = ep.lmask << 6;
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
	ep.fast_depth = nl && ep_clock_is_tsc ? sd : 0; /* the hooks' fast paths (D29) */
	ep.size = size;
	ep_region_pid = pid;

	/* Publish: magic last (a reader may find the descriptor before). */
	__atomic_store_n(&h->magic, EP_MAGIC, __ATOMIC_RELEASE);
	struct stat fst;
	if (fstat(fd, &fst) == 0) {
		/* Before ep_fd: the trap handler reads ep_fd, then these. */
		ep_fd_dev = (uint64_t)fst.st_dev;
		ep_fd_ino = (uint64_t)fst.st_ino;
	}
	__atomic_store_n(&ep_fd, fd, __ATOMIC_RELEASE);

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
EP_SHARED int ep_ensure_init(void) {
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

EP_SHARED_COLD void ep_count_early_drop(void) {
	if (__atomic_load_n(&ep_state, __ATOMIC_ACQUIRE) == 2)
		ADD(&ep.hdr->preinit_drops, 1);
	else
		ADD(&ep_early_drops, 1);
}

/* ---- function table ---- */

/* Find (or insert) key in the shared table and return its index, EP_NONE
 * when every segment up to the cap is full along its probe sequence (the
 * layout in edgeprobe_shm.h, D35). Insertion is one CAS on the key; a
 * segment is counted in func_segs before a key is claimed in it. Lock-free
 * and async-signal-safe: a hook interrupted anywhere here leaves the table
 * consistent (a claimed key whose ep_func.addr copy is not written yet is
 * repaired by the next find). Called on a miss of the thread's counter
 * cache only, so the chain's length costs only those. */
EP_SHARED uint32_t ep_gfind(uint64_t key, uint64_t h) {
	uint32_t base = 0, n = ep_ffirst;
	for (uint32_t seg = 0;;) {
		uint32_t home = (uint32_t)(h >> 32), mask = n - 1;
		for (uint32_t p = 0; p < ep_fprobe; p++) {
			uint32_t j = base + ((home + p) & mask);
			uint64_t a = LOAD(&ep_keys[j]);
			if (a == 0) {
				if (__atomic_compare_exchange_n(&ep_keys[j], &a, key, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
					STORE(&ep.funcs[j].addr, key);
					ADD(&ep.hdr->funcs_used, 1);
					return j;
				}
			}
			if (a == key) {
				if (unlikely(LOAD(&ep.funcs[j].addr) != key))
					STORE(&ep.funcs[j].addr, key); /* its claimer was interrupted for good */
				return j;
			}
		}
		if (++seg >= ep_fsegs_max)
			return EP_NONE;
		/* The next segment: counted in use before we may claim in it, so a
		 * reader that scans func_segs segments sees every key. */
		uint32_t used = __atomic_load_n(&ep.hdr->func_segs, __ATOMIC_ACQUIRE);
		while (used < seg + 1 &&
		       !__atomic_compare_exchange_n(&ep.hdr->func_segs, &used, seg + 1, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			;
		if (seg > 1)
			n <<= 1;
		base = n;
		h = (h ^ (h >> 29)) * EP_HASH_STEP;
	}
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
