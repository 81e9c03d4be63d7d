/* argsmicro.c: the cost of a traced call with its arguments and return value
 * recorded (BENCHMARKS.md row 1d, internal/bench/args.go). Built
 * gcc -O2 -g -pg -mfentry -c, linked without -pg, then coldpatched.
 *
 * Usage: argsmicro N [str]
 *   prints "ready PID", waits for a line on stdin (the harness starts its
 *   capture in between), makes N calls of hit(i, i, x) (or, with "str", of
 *   hits(i, s): a char * argument, copied as a string when recorded),
 *   prints "result calls=N ns=NS ticks=TICKS" (the loop only), then waits
 *   for another line (the harness ends its capture) and exits.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>
#include <unistd.h>

__attribute__((noinline)) long hit(long a, long b, double x) { return a + b + (long)x; }
__attribute__((noinline)) long hits(long a, const char *s) { return a + s[0]; }

static uint64_t mono_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

int main(int argc, char **argv) {
	long n = argc > 1 ? atol(argv[1]) : 100000;
	int str = argc > 2 && strcmp(argv[2], "str") == 0;
	char line[64];
	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		return 1;
	volatile long sink = 0;
	const char *s = "GET /index.html HTTP/1.1";
	uint64_t t0 = mono_ns(), c0 = __rdtsc();
	if (str)
		for (long i = 0; i < n; i++)
			sink += hits(i, s);
	else
		for (long i = 0; i < n; i++)
			sink += hit(i, i, 0.5);
	uint64_t c1 = __rdtsc(), t1 = mono_ns();
	printf("result calls=%ld ns=%llu ticks=%llu\n", n, (unsigned long long)(t1 - t0), (unsigned long long)(c1 - c0));
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		return 0;
	return (int)(sink & 0);
}
