/* edgeprobe_trap.c: the SIGTRAP handler that keeps a process alive when
 * hotpatch is SIGKILLed with an int3 of its own in the text (D89, D90;
 * docs/protocols.md, "SIGKILL and repair").
 *
 * While hotpatch traces the process it sees every SIGTRAP first (its
 * signal-delivery-stop) and never lets one of its own traps through, so this
 * handler runs for one of them only when no tracer took it: hotpatch died
 * (the kernel detached every thread), or a later tracer that did not arm
 * the site passed the signal on. Without a handler the kernel's default
 * action kills the process.
 *
 * A trap is ours when si_code is SI_KERNEL (an int3 instruction; raise() and
 * kill() give SI_TKILL/SI_USER) and the PC - 1 (the int3 was executed) or the
 * PC (a tracer had rewound it to the site and died before resuming the
 * thread: the kernel then delivers the SIGTRAP of that stop with PC = site;
 * the site may be whole by then)
 * is the address of a site in the in-flight table (struct ep_inflight,
 * edgeprobe_shm.h), which hotpatch fills before it writes the first int3 of
 * a batch. Anything else goes to the disposition the program had before
 * (chained; SIG_DFL re-raised so the process dies of SIGTRAP as it would
 * have, SIG_IGN ignored unless the kernel forced the trap).
 *
 * For ours: the PC goes back to the site (the instruction there is executed
 * whole once the site is whole: its probe counts once), and the thread does
 * not return until byte 0 of the site is no longer int3. It tries to make
 * the sites whole itself, as xmod.Repair would (back bytes of the form they
 * already are, inert where that is ambiguous; a core-serialising
 * membarrier; byte 0), only while holding the table's lock and only when no
 * tracer holds its thread or the leader (/proc/thread-self/status,
 * /proc/self/status) and the flock a hotpatch takes of a process whose main
 * thread has exited is free (/proc/self/fd, D95): a hotpatch seizes the
 * leader (or takes that flock) first and then waits for
 * the lock to be free before it reads a site, so the handler never writes
 * under a tracer's protocol. When it cannot (no
 * membarrier SYNC_CORE, no /proc, a tracer present, another thread
 * repairing), it waits (nanosleep) and looks again: a tracer's repair, or
 * the other thread's, makes the byte change.
 *
 * Everything here is async-signal-safe: raw system calls, no libc but the
 * previous handler it chains to.
 */
#include "edgeprobe_internal.h"

#include <signal.h>
#include <ucontext.h>

#ifndef MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE
#define MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE (1 << 5)
#define MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE (1 << 6)
#endif
#ifndef SI_KERNEL
#define SI_KERNEL 0x80
#endif

/* The table: .bss, so a forked child has the copy that goes with its copy
 * of the text. Untouched pages cost nothing. */
EP_HIDDEN struct ep_inflight ep_inflight __attribute__((aligned(64)));

static struct sigaction ep_trap_prev; /* the disposition before ours */
static int ep_trap_installed;
static int ep_trap_sync; /* 1: membarrier SYNC_CORE registered; -1: unavailable */

/* Test builds only (-DEP_TEST_PARK; internal/hotpatch TestHandlerRepairRace):
 * called by a repairing handler, lock held, between choosing a site's byte
 * 0 and writing it, so that a test can attach a hotpatch right there. */
#ifdef EP_TEST_PARK
extern void edgeprobe_test_trap_park(void) __attribute__((weak));
#define EP_TRAP_PARK_POINT()                                                                                       \
	do {                                                                                                       \
		if (edgeprobe_test_trap_park)                                                                      \
			edgeprobe_test_trap_park();                                                                \
	} while (0)
#else
#define EP_TRAP_PARK_POINT() ((void)0)
#endif

EP_INLINE uint8_t ep_trap_byte(uint64_t addr) { return *(volatile const uint8_t *)addr; }

/* The table entry at addr, or 0. */
EP_STATIC struct ep_inflight_site *ep_trap_find(uint64_t addr) {
	uint64_t n = __atomic_load_n(&ep_inflight.count, __ATOMIC_ACQUIRE);
	if (n > EP_INFLIGHT_MAX)
		n = EP_INFLIGHT_MAX;
	for (uint64_t i = 0; i < n; i++) {
		struct ep_inflight_site *e = &ep_inflight.site[i];
		if (LOAD(&e->addr) == addr && e->len >= 1 && e->len < EP_SITE_MAX)
			return e;
	}
	return 0;
}

/* The form a torn site is completed to, as xmod.Repair chooses (D19): the
 * form its back bytes (cur, as read) already are; inert where both forms
 * share them or they are a mix of the two. 0: a back byte belongs to
 * neither form (not ours to write). */
EP_STATIC const uint8_t *ep_trap_form(const struct ep_inflight_site *e, const uint8_t *cur) {
	int act = 1, ine = 1;
	for (uint32_t i = 1; i < e->len; i++) {
		uint8_t b = cur[i];
		if (b != e->active[i])
			act = 0;
		if (b != e->inert[i])
			ine = 0;
		if (b != e->active[i] && b != e->inert[i])
			return 0;
	}
	return act && !ine ? e->active : e->inert;
}

/* Reads a listed site through the /proc/thread-self/mem descriptor fd: 1 when all
 * of it was read. Entries stay listed after their object may have been
 * unmapped (dlclose): a plain load there would fault inside the handler. */
EP_STATIC int ep_trap_peek(long fd, const struct ep_inflight_site *e, uint8_t *cur) {
	if (e->len < 1 || e->len >= EP_SITE_MAX)
		return 0;
	return ep_sys6(SYS_pread64, fd, (long)cur, e->len, (long)e->addr, 0, 0) == (long)e->len;
}

EP_STATIC long ep_trap_open(const char *path, int flags) {
	return ep_sys6(SYS_openat, AT_FDCWD, (long)path, flags | O_CLOEXEC, 0, 0, 0);
}

/* Whether a tracer holds the task of the status file at path: 1 (or
 * unknown), 0 (none). */
EP_STATIC int ep_trap_traced_at(const char *path) {
	long fd = ep_trap_open(path, O_RDONLY);
	if (fd < 0)
		return 1;
	/* TracerPid is the 8th line, after Name (a 15-character comm, at most
	 * 60 bytes escaped) and six short ones: 512 bytes reach it, and keep
	 * the handler's frame small for a program whose alternate signal stack
	 * is only MINSIGSTKSZ. */
	char buf[512];
	long n = ep_sys6(SYS_read, fd, (long)buf, sizeof buf - 1, 0, 0, 0);
	ep_sys1(SYS_close, fd);
	if (n <= 0)
		return 1;
	buf[n] = 0;
	static const char key[] = "\nTracerPid:";
	for (long i = 0; i + (long)sizeof key - 1 <= n; i++) {
		long k = 0;
		while (key[k] && buf[i + k] == key[k])
			k++;
		if (key[k])
			continue;
		const char *p = buf + i + k;
		while (*p == ' ' || *p == '\t')
			p++;
		return !(p[0] == '0' && (p[1] == '\n' || p[1] == 0));
	}
	return 1;
}

#ifndef LOCK_EX
#define LOCK_SH 1
#define LOCK_EX 2
#define LOCK_NB 4
#define LOCK_UN 8
#endif

/* Whether a hotpatch holds the lock of a process whose main thread has
 * exited (D95): an exclusive flock of /proc/PID/fd, which it takes before
 * it reads a site. Taken and dropped at once here: 1 (or unknown) when it
 * is held, 0 when it was free. /proc/self is the process's directory
 * (its thread-group id), the file hotpatch locks. */
EP_STATIC int ep_trap_flocked(void) {
	long fd = ep_trap_open("/proc/self/fd", O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		return 1;
	long r = ep_sys2(SYS_flock, fd, LOCK_EX | LOCK_NB);
	if (r == 0)
		ep_sys2(SYS_flock, fd, LOCK_UN);
	ep_sys1(SYS_close, fd);
	return r != 0;
}

/* Whether a hotpatch holds the runtime's region file (D101): an exclusive
 * flock hotpatch takes of the region's memfd (through /proc/PID/fd/N)
 * before it reads the repair lock, and keeps for the rest of its session.
 * The memfd is one inode whatever /proc or pid namespace a hotpatch sees
 * the process through, where TracerPid names a tracer outside this
 * process's pid namespace as 0 and the flock of /proc/self/fd is of this
 * /proc's inode only (a container's own /proc). Tried on an open file of
 * our own (/proc/thread-self/fd/N opened again), never on ep_fd itself: a program
 * that closed every descriptor may have its own file at that number, with
 * a flock it holds through that very open file, which our LOCK_EX would
 * share and our LOCK_UN release (the lead's review of D101). The file
 * opened must be the memfd (device and inode recorded at its creation).
 * 1 when another holds it; 0 when it was free or cannot be checked (no
 * region yet, the number now names another file, no /proc: the other
 * checks stand). */
EP_STATIC int ep_trap_region_locked(void) {
	int n = __atomic_load_n(&ep_fd, __ATOMIC_ACQUIRE);
	if (n < 0)
		return 0;
	/* thread-self: the main thread's /proc/self/fd reaches nothing once
	 * it has exited (D95). */
	char path[48] = "/proc/thread-self/fd/", digits[12];
	int k = 0, len = 21;
	do
		digits[k++] = (char)('0' + n % 10);
	while ((n /= 10) > 0);
	while (k > 0)
		path[len++] = digits[--k];
	path[len] = 0;
	long fd = ep_trap_open(path, O_RDONLY);
	if (fd < 0)
		return 0;
	int held = 0;
	struct stat st;
	if (ep_sys2(SYS_fstat, fd, (long)&st) == 0 && (uint64_t)st.st_dev == ep_fd_dev && (uint64_t)st.st_ino == ep_fd_ino) {
		long r = ep_sys2(SYS_flock, fd, LOCK_EX | LOCK_NB);
		if (r == 0)
			ep_sys2(SYS_flock, fd, LOCK_UN); /* our own open file's lock only */
		held = r == -EWOULDBLOCK;
	}
	ep_sys1(SYS_close, fd);
	return held;
}

/* Whether a hotpatch holds this process: a tracer holds this thread or the
 * process's leader, or the lock of a process whose main thread has exited
 * is held. Every hotpatch session seizes the leader first (its lock) and
 * then waits for the repair lock to be free (D90), so a handler that finds
 * neither traced after taking the lock writes before any hotpatch reads a
 * site. When the main thread has exited, a session that seized it before
 * still shows in its TracerPid (a zombie stays traced until its tracer
 * exits), and one that started after holds the flock first, then waits
 * for the repair lock (D95): the same order, so the same argument. A
 * hotpatch outside this process's pid namespace (or reading another /proc)
 * shows in none of these: it holds the region's flock before it reads the
 * repair lock (D101), the same order again. */
EP_STATIC int ep_trap_traced(void) {
	return ep_trap_traced_at("/proc/thread-self/status") || ep_trap_traced_at("/proc/self/status") ||
	       ep_trap_flocked() || ep_trap_region_locked();
}

EP_STATIC int ep_trap_barrier(void) {
	long r = ep_sys2(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, 0);
	if (r == -EPERM) {
		/* A fork child that inherited our flag but not the registration. */
		ep_sys2(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, 0);
		r = ep_sys2(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, 0);
	}
	return r == 0;
}

/* Makes every listed site that holds an int3 over bytes of its own forms
 * whole, in xmod.Repair's order: back bytes, a core-serialising barrier
 * (every thread of the process executes a serialising instruction before
 * it returns to user mode), byte 0 (one byte: atomic). Returns 1 when it
 * ran (whatever it found), 0 when it could not (it then wrote nothing, or
 * only back bytes behind an int3, which no thread executes). */
EP_STATIC int ep_trap_repair(void) {
	int sync = __atomic_load_n(&ep_trap_sync, __ATOMIC_RELAXED);
	if (sync == 0) {
		/* Registered here, not at load: only a process that meets this
		 * case pays for it (the registration waits for an RCU grace
		 * period). It is per address space, so any thread's will do. */
		sync = ep_sys2(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, 0) == 0 ? 1 : -1;
		__atomic_store_n(&ep_trap_sync, sync, __ATOMIC_RELAXED);
	}
	if (sync < 0)
		return 0;
	uint64_t me = (uint64_t)ep_sys1(SYS_gettid, 0), free = 0;
	if (!__atomic_compare_exchange_n(&ep_inflight.lock, &free, me, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
		return 0;
	/* The lock is taken (a full barrier) before the tracer check: a
	 * hotpatch that seizes this thread after the check reads the lock
	 * after the seize, and waits. */
	int done = 0;
	long fd = -1;
	/* The thread's own mem file: /proc/self/mem is the main thread's,
	 * which reaches no memory once it has exited (D95). */
	if (!ep_trap_traced())
		fd = ep_trap_open("/proc/thread-self/mem", O_RDWR);
	if (fd >= 0) {
		uint64_t n = __atomic_load_n(&ep_inflight.count, __ATOMIC_ACQUIRE);
		if (n > EP_INFLIGHT_MAX)
			n = EP_INFLIGHT_MAX;
		int ok = 1, any = 0;
		uint8_t cur[EP_SITE_MAX];
		for (uint64_t i = 0; i < n && ok; i++) {
			struct ep_inflight_site *e = &ep_inflight.site[i];
			if (!ep_trap_peek(fd, e, cur) || cur[0] != 0xcc)
				continue;
			const uint8_t *f = ep_trap_form(e, cur);
			if (!f)
				continue;
			any = 1;
			for (uint32_t j = 1; j < e->len; j++) {
				if (cur[j] == f[j])
					continue;
				if (ep_sys6(SYS_pwrite64, fd, (long)(f + 1), e->len - 1, (long)(e->addr + 1), 0, 0) != (long)e->len - 1)
					ok = 0;
				break;
			}
		}
		/* Always a barrier, as xmod.Repair: the killed hotpatch may have
		 * died right after writing the back bytes. */
		if (any && ok && ep_trap_barrier()) {
			for (uint64_t i = 0; i < n; i++) {
				struct ep_inflight_site *e = &ep_inflight.site[i];
				if (!ep_trap_peek(fd, e, cur) || cur[0] != 0xcc)
					continue;
				const uint8_t *f = ep_trap_form(e, cur);
				EP_TRAP_PARK_POINT();
				if (f && ep_sys6(SYS_pwrite64, fd, (long)f, 1, (long)e->addr, 0, 0) == 1)
					__atomic_fetch_add(&ep_inflight.repairs, 1, __ATOMIC_RELAXED);
			}
			(void)ep_trap_barrier();
			done = 1;
		}
		ep_sys1(SYS_close, fd);
	}
	__atomic_store_n(&ep_inflight.lock, 0, __ATOMIC_RELEASE);
	return done;
}

/* Waits until byte 0 of e is no longer int3, repairing if it can. */
EP_STATIC void ep_trap_settle(const struct ep_inflight_site *e) {
	int counted = 0;
	for (;;) {
		if (ep_trap_byte(e->addr) != 0xcc)
			return;
		if (ep_sys_off()) {
			/* Under seccomp (D56) no system call: the thread waits in
			 * user mode for an outside `hotpatch repair`. */
			if (!counted++)
				__atomic_fetch_add(&ep_inflight.holds, 1, __ATOMIC_RELAXED);
			__asm__ volatile("pause" ::: "memory");
			continue;
		}
		if (ep_trap_repair() && ep_trap_byte(e->addr) != 0xcc)
			return;
		if (!counted++)
			__atomic_fetch_add(&ep_inflight.holds, 1, __ATOMIC_RELAXED);
		struct timespec ts = {0, 2000000}; /* 2 ms */
		ep_sys2(SYS_nanosleep, (long)&ts, 0);
	}
}

/* Hands a trap that is not ours to the disposition the program had. */
EP_STATIC void ep_trap_chain(int sig, siginfo_t *si, void *uc) {
	struct sigaction *p = &ep_trap_prev;
	if (p->sa_flags & SA_SIGINFO) {
		if (p->sa_sigaction)
			p->sa_sigaction(sig, si, uc);
		return;
	}
	if (p->sa_handler == SIG_IGN && si->si_code != SI_KERNEL)
		return; /* ignored, as before */
	if (p->sa_handler != SIG_DFL && p->sa_handler != SIG_IGN) {
		p->sa_handler(sig);
		return;
	}
	/* SIG_DFL (or an ignored trap the kernel forced, which it resets to
	 * SIG_DFL): the default disposition back, and the signal again. It is
	 * blocked while this handler runs, so it is delivered as the handler
	 * returns, before another instruction: the process dies of SIGTRAP
	 * (core) at the same place as without the runtime. */
	struct sigaction d;
	memset(&d, 0, sizeof d);
	d.sa_handler = SIG_DFL;
	sigaction(SIGTRAP, &d, 0);
	ep_sys6(SYS_tgkill, ep_sys1(SYS_getpid, 0), ep_sys1(SYS_gettid, 0), SIGTRAP, 0, 0, 0);
}

EP_STATIC void ep_trap_handler(int sig, siginfo_t *si, void *ucv) {
	int saved = errno;
	ucontext_t *uc = ucv;
	uint64_t pc = (uint64_t)uc->uc_mcontext.gregs[REG_RIP];
	struct ep_inflight_site *e = 0;
	if (si->si_code == SI_KERNEL) {
		/* PC - 1: the int3 just executed. PC: a dying tracer had rewound
		 * the thread to the site (the site may be whole by now, made so
		 * by another thread's handler: not a reason to die). */
		e = ep_trap_find(pc - 1);
		if (!e)
			e = ep_trap_find(pc);
	}
	if (!e) {
		ep_trap_chain(sig, si, ucv);
		errno = saved;
		return;
	}
	__atomic_fetch_add(&ep_inflight.traps, 1, __ATOMIC_RELAXED);
	uc->uc_mcontext.gregs[REG_RIP] = (greg_t)e->addr;
	ep_trap_settle(e);
	errno = saved;
}

/* Installs the handler (once), keeping the previous disposition to chain
 * to. Called by the constructor; the region's header then publishes the
 * table's address (edgeprobe_region.c). */
EP_SHARED void ep_trap_install(void) {
	if (ep_trap_installed)
		return;
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = ep_trap_handler;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	/* EDGEPROBE_TRAP_REPAIR=0: never write the text from the handler, only
	 * hold threads until a hotpatch repairs the sites. */
	if (!ep_env_u64("EDGEPROBE_TRAP_REPAIR", 1, 1))
		ep_trap_sync = -1;
	if (sigaction(SIGTRAP, &sa, &ep_trap_prev) == 0)
		ep_trap_installed = 1;
}

/* Whether the table is in use: the handler is installed. */
EP_SHARED int ep_trap_ready(void) { return ep_trap_installed; }

/* The fork child: no handler of its own runs in it (one thread, the
 * forking one), so a lock copied from the parent mid-repair is stale. */
EP_SHARED void ep_trap_forked(void) { __atomic_store_n(&ep_inflight.lock, 0, __ATOMIC_RELAXED); }

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
