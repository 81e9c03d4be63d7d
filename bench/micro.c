/* micro.c: the iProbe micro-benchmark (Arora et al., Fig. 5) and the probe
 * invocation / inert-site benchmark: N calls of an empty function, timed with
 * rdtsc and CLOCK_MONOTONIC around the loop.
 *
 * Usage: micro N [wait|tsc]
 *   N     calls of empty() in the timed loop (no other call of empty() is
 *         made, so a peer that counts entries and exits must count exactly N)
 *   wait  print "ready PID" and block until a line arrives on stdin before
 *         the loop (the harness enables probes in between)
 *   tsc   call empty_tsc() instead, N times: empty() plus one rdtsc, so that
 *         the difference from plain empty() calls is what one clock read adds
 *         to a call (the runtime's timed hit reads the TSC once per hook)
 * Output: "result calls=N ns=NS ticks=TICKS" (loop only), and with -DXRAY
 *         also "xray patch_ns=... patch_ticks=... entries=... exits=...".
 *
 * Before the loop the program spins ~20 ms without calling empty() (a warm-up
 * that lets the core reach its steady clock without adding probe hits).
 * empty() is `nop; ret` when not instrumented: the nop gives a uprobe an
 * emulated first instruction and a gdb exit breakpoint an address of its own.
 *
 * Builds (internal/bench/build.go runs exactly these; OUT is the binary):
 *   uninstrumented: gcc -O2 -g bench/micro.c -o OUT
 *   instrumented:   gcc -O2 -g -finstrument-functions bench/micro.c -o OUT
 *                   (then coldpatch for the inert builds)
 *   XRay:           clang -O2 -g -DXRAY -fxray-instrument
 *                   -fxray-instruction-threshold=1 bench/micro.c -o OUT
 *   clang baseline: clang -O2 -g bench/micro.c -o OUT
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#define NOI __attribute__((no_instrument_function))
#ifdef XRAY
#define NOX __attribute__((xray_never_instrument))
#define ALWAYSX __attribute__((xray_always_instrument))
/* xray/xray_interface.h is C++; these are its extern "C" entry points. */
extern int __xray_set_handler(void (*entry)(int32_t, int));
extern int __xray_patch(void);
extern int __xray_unpatch(void);
static volatile uint64_t xray_entries, xray_exits;
NOX static void xray_count(int32_t fid, int type) {
	(void)fid;
	if (type == 0) /* ENTRY */
		xray_entries++;
	else /* EXIT, TAIL */
		xray_exits++;
}
#else
#define NOX
#define ALWAYSX
#endif

__attribute__((noinline)) ALWAYSX void empty(void) { __asm__ volatile("nop"); }
/* empty() with one rdtsc, whose value is dropped as the runtime's would be
 * consumed off the critical path. Never instrumented. */
__attribute__((noinline)) NOI NOX void empty_tsc(void) { __asm__ volatile("nop; rdtsc" ::: "eax", "edx"); }

NOI NOX static uint64_t mono_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

NOI NOX int main(int argc, char **argv) {
	long n = argc > 1 ? atol(argv[1]) : 1000000;
	int wait = argc > 2 && strcmp(argv[2], "wait") == 0;
	int tsc = argc > 2 && strcmp(argv[2], "tsc") == 0;
#ifdef XRAY
	__xray_set_handler(xray_count);
	uint64_t p0 = mono_ns(), c0 = __rdtsc();
	int st = __xray_patch();
	uint64_t c1 = __rdtsc(), p1 = mono_ns();
	if (st != 1) { /* XRayPatchingStatus SUCCESS */
		fprintf(stderr, "__xray_patch failed: status %d\n", st);
		return 2;
	}
#endif
	if (wait) {
		printf("ready %d\n", (int)getpid());
		fflush(stdout);
		char line[64];
		if (!fgets(line, sizeof line, stdin))
			return 3;
	}
	for (uint64_t t = mono_ns(); mono_ns() - t < 20000000;) /* warm-up */
		;
	uint64_t t0 = mono_ns(), k0 = __rdtsc();
	if (tsc)
		for (long i = 0; i < n; i++)
			empty_tsc();
	else
		for (long i = 0; i < n; i++)
			empty();
	uint64_t k1 = __rdtsc(), t1 = mono_ns();
	printf("result calls=%ld ns=%llu ticks=%llu\n", n, (unsigned long long)(t1 - t0),
	       (unsigned long long)(k1 - k0));
#ifdef XRAY
	printf("xray patch_ns=%llu patch_ticks=%llu entries=%llu exits=%llu\n",
	       (unsigned long long)(p1 - p0), (unsigned long long)(c1 - c0),
	       (unsigned long long)xray_entries, (unsigned long long)xray_exits);
	__xray_unpatch();
#endif
	return 0;
}
