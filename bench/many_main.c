/* many_main.c: the driver of the batch benchmark's generated program, whose
 * other source (many_funcs.c, written by internal/bench.GenMany) defines N
 * instrumented functions f0..f{N-1} and the table many_table[many_count].
 *
 * Usage: many [exec]
 *   exec  one executor thread keeps calling every function in turn
 * It prints "ready PID", then serves stdin commands:
 *   calls   print "calls C enters E exits X"
 *   xray    (built -DXRAY) time __xray_patch() and __xray_unpatch() of every
 *           function: "xray funcs=F patch_ns=.. patch_ticks=.. unpatch_ns=..
 *           unpatch_ticks=.."
 *   quit    stop, print the final "calls ..." line, exit 0 (EOF is quit)
 * A SIGILL/SIGSEGV/SIGBUS/SIGTRAP/SIGFPE prints "torn SIG" and exits 86.
 *
 * Build (internal/bench/build.go runs exactly these):
 *   gcc -O1 -g -pthread -finstrument-functions bench/many_main.c many_funcs.c -o OUT
 *   clang -O1 -g -pthread -DXRAY -fxray-instrument -fxray-instruction-threshold=1 \
 *         bench/many_main.c many_funcs.c -o OUT
 */
#include <pthread.h>
#include <signal.h>
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
extern int __xray_patch(void);
extern int __xray_unpatch(void);
extern size_t __xray_max_function_id(void);
#else
#define NOX
#endif

extern int (*const many_table[])(int);
extern const int many_count;

static volatile uint64_t calls, enters, exits;
static volatile int stop;

__attribute__((noinline)) NOI NOX void __cyg_profile_func_enter(void *fn, void *site) {
	(void)fn, (void)site;
	enters++;
}

__attribute__((noinline)) NOI NOX void __cyg_profile_func_exit(void *fn, void *site) {
	(void)fn, (void)site;
	exits++;
}

NOI NOX static uint64_t mono_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

NOI NOX static void *executor(void *arg) {
	(void)arg;
	int x = 0;
	while (!stop)
		for (int i = 0; i < many_count; i++) {
			x = many_table[i](x);
			calls++;
		}
	return (void *)(intptr_t)x;
}

NOI NOX static void report(void) {
	printf("calls %llu enters %llu exits %llu\n", (unsigned long long)calls,
	       (unsigned long long)enters, (unsigned long long)exits);
	fflush(stdout);
}

NOI NOX static void torn(int sig) {
	char msg[32];
	int k = snprintf(msg, sizeof msg, "torn %d\n", sig);
	if (write(1, msg, (size_t)k) < 0)
		_exit(87);
	_exit(86);
}

NOI NOX int main(int argc, char **argv) {
	int exec = argc > 1 && strcmp(argv[1], "exec") == 0;
	int sigs[] = {SIGILL, SIGSEGV, SIGBUS, SIGTRAP, SIGFPE};
	for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
		signal(sigs[i], torn);
	pthread_t th;
	if (exec)
		pthread_create(&th, NULL, executor, NULL);
	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	char line[64];
	while (fgets(line, sizeof line, stdin)) {
		if (strncmp(line, "calls", 5) == 0)
			report();
#ifdef XRAY
		else if (strncmp(line, "xray", 4) == 0) {
			uint64_t t0 = mono_ns(), k0 = __rdtsc();
			int a = __xray_patch();
			uint64_t k1 = __rdtsc(), t1 = mono_ns();
			int b = __xray_unpatch();
			uint64_t k2 = __rdtsc(), t2 = mono_ns();
			printf("xray funcs=%zu status=%d,%d patch_ns=%llu patch_ticks=%llu unpatch_ns=%llu unpatch_ticks=%llu\n",
			       __xray_max_function_id(), a, b, (unsigned long long)(t1 - t0),
			       (unsigned long long)(k1 - k0), (unsigned long long)(t2 - t1),
			       (unsigned long long)(k2 - k1));
			fflush(stdout);
		}
#endif
		else if (strncmp(line, "quit", 4) == 0)
			break;
	}
	stop = 1;
	if (exec)
		pthread_join(th, NULL);
	report();
	return 0;
}
