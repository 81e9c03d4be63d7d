/* edgeprobe_seccomp.c: stop the hooks' own system calls once the program
 * enters a seccomp filter (or strict) mode through libc.
 *
 * Why: with --args the fentry hook copies char * arguments with
 * process_vm_readv (edgeprobe_args.c). A program that sandboxes itself
 * after a capture started (services, renderers) may forbid that call, and
 * its filter then kills it (SIGSYS) at the next copy. The capture re-checks
 * /proc at each drain (docs/tracing.md), which leaves a window of a drain
 * period; this file closes it for programs that use libc's prctl() or
 * syscall(SYS_seccomp, ...) (libseccomp's seccomp_load does one of these).
 *
 * How: prctl and syscall are defined here (default visibility, weak), so a
 * preloaded runtime comes before libc in symbol lookup. On PR_SET_SECCOMP
 * or SYS_seccomp with SECCOMP_SET_MODE_STRICT/FILTER they set ep_nosys
 * BEFORE making the call: a filter applies to the calling thread at once
 * (and with TSYNC to every thread), so the flag must be up first. It is set
 * even if the call then fails (a lost copy is harmless, a kill is not), and
 * never cleared (filters cannot be removed). The hooks then record char *
 * values as bare pointers (the plan's string bits cleared in the record,
 * the representation the capture's DropArgStrings also produces).
 *
 * Both are reimplemented with the raw syscall instruction instead of being
 * forwarded through dlsym(RTLD_NEXT): glibc's prctl and syscall are plain
 * wrappers (kernel result, -1 and errno on -4095..-1), so the program sees
 * the same return value and errno; and the raw form cannot recurse, is
 * async-signal-safe (dlsym is not) and works in static programs, where
 * RTLD_NEXT finds nothing. Weak: in a static link where libc.a's own
 * definition is pulled in anyway, libc's wins instead of a link error.
 *
 * Not covered (docs/tracing.md): a runtime loaded into a running process
 * with dlopen comes after libc in lookup order, so the program's calls
 * reach libc's prctl/syscall; and raw syscall instructions bypass libc.
 */
#include "edgeprobe_internal.h"

#include <stdarg.h>

/* Set once the program asked for a seccomp mode (or one was found, D56);
 * read relaxed through ep_sys_off before each of the hooks' system calls. */
EP_HIDDEN int ep_nosys;

#define EP_PR_SET_SECCOMP 22 /* <linux/prctl.h> */
#define EP_SECCOMP_MODE_STRICT 1
#define EP_SECCOMP_MODE_FILTER 2
#define EP_SECCOMP_SET_MODE_STRICT 0
#define EP_SECCOMP_SET_MODE_FILTER 1

/* What glibc's wrappers do with the kernel's result. */
__attribute__((no_instrument_function)) static long ep_libc_result(long r) {
	if ((unsigned long)r > -4096UL) {
		errno = (int)-r;
		return -1;
	}
	return r;
}

__attribute__((visibility("default"), weak, no_instrument_function)) int prctl(int option, ...) {
	va_list ap;
	va_start(ap, option);
	unsigned long a2 = va_arg(ap, unsigned long), a3 = va_arg(ap, unsigned long);
	unsigned long a4 = va_arg(ap, unsigned long), a5 = va_arg(ap, unsigned long);
	va_end(ap);
	if (option == EP_PR_SET_SECCOMP && (a2 == EP_SECCOMP_MODE_STRICT || a2 == EP_SECCOMP_MODE_FILTER))
		__atomic_store_n(&ep_nosys, 1, __ATOMIC_SEQ_CST);
	return (int)ep_libc_result(ep_sys6(SYS_prctl, option, (long)a2, (long)a3, (long)a4, (long)a5, 0));
}

__attribute__((visibility("default"), weak, no_instrument_function)) long syscall(long nr, ...) {
	va_list ap;
	va_start(ap, nr);
	long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long);
	long d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
	va_end(ap);
	if (nr == SYS_seccomp && (a == EP_SECCOMP_SET_MODE_STRICT || a == EP_SECCOMP_SET_MODE_FILTER))
		__atomic_store_n(&ep_nosys, 1, __ATOMIC_SEQ_CST);
	return ep_libc_result(ep_sys6(nr, a, b, c, d, e, f));
}

/* Whether the thread or the process is under seccomp now: the Seccomp:
 * field of /proc/thread-self/status (this thread) and /proc/self/status
 * (the main thread). Run where the region is made, before any other of its
 * system calls: a runtime loaded by dlopen into a sandboxed process (the
 * interposers come after libc there), a fork child of a program whose
 * filter the interposers did not see. openat, read and close only: the
 * loader has just made the same calls to map this library. Raw system
 * calls: errno untouched. Other threads' own filters (installed without
 * TSYNC) are not seen here; hotpatch looks at every thread (D56). */
EP_STATIC int ep_status_seccomp(const char *path) {
	int fd = (int)ep_sys6(SYS_openat, AT_FDCWD, (long)path, O_RDONLY | O_CLOEXEC, 0, 0, 0);
	if (fd < 0)
		return 0; /* no /proc: nothing known */
	char buf[4096];
	long n = 0, r;
	while (n < (long)sizeof buf - 1 && (r = ep_sys6(SYS_read, fd, (long)(buf + n), (long)sizeof buf - 1 - n, 0, 0, 0)) > 0)
		n += r;
	ep_sys1(SYS_close, fd);
	buf[n > 0 ? n : 0] = 0;
	static const char key[] = "\nSeccomp:";
	for (long i = 0; i + (long)sizeof key - 1 < n; i++) {
		if (__builtin_memcmp(buf + i, key, sizeof key - 1) != 0)
			continue;
		const char *p = buf + i + sizeof key - 1;
		while (*p == ' ' || *p == '\t')
			p++;
		return *p >= '1' && *p <= '9';
	}
	return 0;
}

EP_SHARED_COLD int ep_seccomp_at_load(void) {
	return ep_status_seccomp("/proc/thread-self/status") || ep_status_seccomp("/proc/self/status");
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
