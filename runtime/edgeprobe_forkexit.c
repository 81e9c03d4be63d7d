/* edgeprobe_forkexit.c: process life cycle: fork, start, exit, dump.
 *
 * Owns the pthread_atfork handlers (hooks on the forking thread are dropped
 * between prepare and parent/child; the child gets its own region at its
 * first hook), the constructor (region set-up, handler registration) and the
 * destructor (exit time stamps, the EDGEPROBE_OUTPUT dump: an O_EXCL
 * temporary renamed over the output).
 *
 * Locking: none. Each handler sets the busy word (EP_BUSY_HARD) so that a
 * hook interrupting it on this thread is dropped; the fork child handler
 * forgets the slot and the region before unmapping it, for a signal arriving
 * meanwhile. The destructor calls libc (open, pwrite, rename).
 */
#include "edgeprobe_internal.h"

static int ep_atfork_done;

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
	/* Under seccomp (D56) the child inherits the filter: it keeps the flag
	 * (ep_sys_off copies the parent's header word), makes no system call
	 * here (the parent's mapping and descriptor stay, unused) and makes no
	 * region of its own. */
	int nosys = ep_sys_off();
	ep_trap_forked();
	int had = __atomic_exchange_n(&ep_state, 0, __ATOMIC_ACQ_REL) == 2;
	SIGFENCE();
	ep_early_drops = 0;
	ep_forked = 1;
	/* The fentry return-address stack (TLS pointer, private mapping) is
	 * copied with the process and stays valid: the child returns through its
	 * inherited hijacked frames; their exits count as orphans in its region. */
	ep_epoch++;
	if (had) {
		if (!nosys)
			munmap(ep.base, ep.size);
		memset(&ep, 0, sizeof ep);
	}
	/* the parent's descriptor: the child's region gets its own */
	if (ep_fd >= 0) {
		if (!nosys)
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

/* Whether the region's page at off holds ring cells in use: each slot's ring
 * uses its first ring_size cells of the ring_events it reserves, and reading
 * the rest of a reserve would make shmem allocate every page of it. Pages
 * outside the rings always count. */
EP_STATIC int ep_page_used(uint64_t off) {
	uint64_t ro = ep.ring_off, stride = ep.ring_stride;
	if (off + 4096 <= ro || !stride || off >= ro + (uint64_t)ep.max_threads * stride)
		return 1;
	uint64_t first = off > ro ? (off - ro) / stride : 0;
	uint64_t last = (off + 4095 - ro) / stride;
	for (uint64_t i = first; i <= last && i < ep.max_threads; i++) {
		struct ep_thread *th = ep_slot((uint32_t)i);
		uint64_t lo = ro + i * stride, hi = lo + (uint64_t)LOAD(&th->ring_size) * sizeof(struct ep_event);
		if (lo < off + 4096 && hi > off)
			return 1;
	}
	return 0;
}

/* Write n bytes of the region from src at file offset off, zero pages and
 * unused ring pages as holes; 0 on an error. */
EP_STATIC int ep_write_range(int fd, const char *src, uint64_t n, uint64_t off) {
	const uint64_t chunk = 4096;
	for (uint64_t at = 0; at < n; at += chunk) {
		size_t k = n - at < chunk ? (size_t)(n - at) : (size_t)chunk;
		if (!ep_page_used((uint64_t)(src + at - ep.base)) || ep_page_zero(src + at, k))
			continue;
		for (size_t done = 0; done < k;) {
			ssize_t w = pwrite(fd, src + at + done, k - done, (off_t)(off + at + done));
			if (w <= 0) {
				if (w < 0 && errno == EINTR)
					continue;
				return 0;
			}
			done += (size_t)w;
		}
	}
	return 1;
}

/* Write the region (zero pages as holes) and a copy of /proc/self/maps to
 * ep_out via a temporary file and rename. Only the function-table segments
 * in use are written (the output's max_funcs is their slots): the rest of
 * the table is address space the process never used. */
EP_STATIC void ep_write_output(void) {
	/* The file keeps what is used, not what is reserved: each ring's cells
	 * in use (rings of the largest size any thread uses, so that a reader
	 * finds each slot's ring_size cells at its slot's offset) and the
	 * function table's segments in use; the counters and keys follow the
	 * rings as in the live region. */
	const struct ep_header *h = ep.hdr;
	uint32_t segs = __atomic_load_n(&h->func_segs, __ATOMIC_ACQUIRE);
	uint64_t used = (uint64_t)h->func_first << (segs - 1);
	uint32_t rdef = h->ring_def, nr = ep.ring_events ? rdef : 0;
	for (uint32_t i = 0; i < ep.max_threads && ep.ring_events; i++) {
		uint32_t n = LOAD(&ep_slot(i)->ring_size);
		if (n > nr && n <= ep.ring_events)
			nr = n;
	}
	uint64_t rstride = ((uint64_t)nr * sizeof(struct ep_event) + 63) & ~63ull;
	uint64_t keys_off = (ep.ring_off + (uint64_t)ep.max_threads * rstride + 63) & ~63ull;
	uint64_t func_off = (keys_off + used * sizeof(uint64_t) + 63) & ~63ull;
	uint64_t size = (func_off + used * sizeof(struct ep_func) + 4095) & ~4095ull;
	/* A file-size limit (RLIMIT_FSIZE) applies here too: a write past it
	 * raises SIGXFSZ, whose default action kills the program at its exit
	 * (and loses its exit status). Never write past it: the output is
	 * skipped, with one line, when it does not fit. */
	uint64_t flim = ~0ull;
	struct rlimit fl;
	if (getrlimit(RLIMIT_FSIZE, &fl) == 0 && fl.rlim_cur != RLIM_INFINITY)
		flim = (uint64_t)fl.rlim_cur;
	if (size > flim) {
		ep_say("EDGEPROBE_OUTPUT would exceed the file-size limit (ulimit -f); not written", 0);
		return;
	}
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
	int ok = ep_write_range(fd, ep.base + EP_HEADER_SIZE, ep.ring_off - EP_HEADER_SIZE, EP_HEADER_SIZE);
	for (uint32_t i = 0; i < ep.max_threads && nr && ok; i++) {
		uint32_t n = LOAD(&ep_slot(i)->ring_size);
		if (n == 0 || n > nr)
			n = rdef;
		ok = ep_write_range(fd, ep.base + ep.ring_off + (uint64_t)i * ep.ring_stride,
				    (uint64_t)n * sizeof(struct ep_event), ep.ring_off + (uint64_t)i * rstride);
	}
	ok = ok && ep_write_range(fd, ep.base + h->keys_off, used * sizeof(uint64_t), keys_off) &&
	     ep_write_range(fd, (const char *)ep.funcs, used * sizeof(struct ep_func), func_off);
	uint64_t mlen = 0;
	/* The exiting thread's own: /proc/self is the main thread's, whose maps
	 * read empty once it has exited while the process ran on (D95). */
	int mfd = open("/proc/thread-self/maps", O_RDONLY | O_CLOEXEC);
	if (mfd >= 0) {
		char buf[4096];
		for (;;) {
			ssize_t r = read(mfd, buf, sizeof buf);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0)
				break;
			if (size + mlen + (uint64_t)r > flim) {
				ok = 0;
				errno = EFBIG;
				break;
			}
			if (pwrite(fd, buf, (size_t)r, (off_t)(size + mlen)) != r) {
				ok = 0;
				break;
			}
			mlen += (uint64_t)r;
		}
		close(mfd);
	}
	if (ftruncate(fd, (off_t)(size + mlen)) != 0)
		ok = 0;
	struct ep_header hcopy;
	memcpy(&hcopy, ep.hdr, sizeof hcopy);
	hcopy.region_size = size;
	hcopy.max_funcs = (uint32_t)used;
	hcopy.func_segs = segs;
	hcopy.func_off = func_off;
	hcopy.keys_off = keys_off;
	hcopy.ring_events = nr;
	hcopy.ring_stride = rstride;
	if (hcopy.ring_req > nr)
		hcopy.ring_req = nr;
	hcopy.maps_off = mlen ? size : 0;
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
	/* Before the region: a hotpatch that finds the region may list sites
	 * in the in-flight table at once (D89). Not under seccomp (D56). */
	if (!ep_sys_off())
		ep_trap_install();
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
	/* Under seccomp (D56): no getpid, no EDGEPROBE_OUTPUT (open, write,
	 * rename could be what the filter kills for, at the program's exit). */
	if (__atomic_load_n(&ep_state, __ATOMIC_ACQUIRE) != 2 || ep_sys_off() || ep_region_pid != getpid())
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
