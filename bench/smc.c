/* smc: what a cross-modifying store costs the thread executing the code,
 * the hardware floor under row 7's "target throughput while toggled".
 * Thread E (CPU 1) calls f() (on its own page) in a loop; thread W (CPU 0)
 * stores a byte, the value it already holds, at RATE stores/s into: "none"
 * (no store), "same" (f's own cache line), "line+64" (the next line, not
 * executed), "page+2048" (same page, far), "other" (another page). Prints
 * E's calls per CPU-second (its thread CPU clock, so time other load takes
 * from it does not count) per mode, rounds interleaved, as ratios to "none".
 * Build: gcc -O2 -pthread -o smc bench/smc.c; run: ./smc RATE WINDOW_S ROUNDS */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef void (*fn)(void);
static unsigned char *page;
static volatile unsigned long calls;
static volatile int stopall;
static volatile unsigned char *target;
static volatile int storing;
static volatile unsigned long stores;
static clockid_t ecpu;

static void pin(int c) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(c, &s); pthread_setaffinity_np(pthread_self(), sizeof s, &s); }
static double now(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec + t.tv_nsec / 1e9; }

static void *exec_thread(void *a) {
	(void)a;
	pin(1);
	pthread_getcpuclockid(pthread_self(), &ecpu);
	fn f = (fn)(page + 0); /* f: "ret" at page[0] preceded by nops: nop x8, ret */
	while (!stopall) { f(); f(); f(); f(); calls += 4; }
	return 0;
}

static void *write_thread(void *a) {
	long rate = (long)a;
	pin(0);
	struct timespec next; clock_gettime(CLOCK_MONOTONIC, &next);
	long period = 1000000000L / rate;
	while (!stopall) {
		if (storing && target) { unsigned char v = *target; *target = v; stores++; }
		next.tv_nsec += period;
		while (next.tv_nsec >= 1000000000L) { next.tv_nsec -= 1000000000L; next.tv_sec++; }
		struct timespec t;
		do clock_gettime(CLOCK_MONOTONIC, &t);
		while (t.tv_sec < next.tv_sec || (t.tv_sec == next.tv_sec && t.tv_nsec < next.tv_nsec));
	}
	return 0;
}

int main(int argc, char **argv) {
	long rate = argc > 1 ? atol(argv[1]) : 100000;
	double win = argc > 2 ? atof(argv[2]) : 0.2;
	int rounds = argc > 3 ? atoi(argv[3]) : 5;
	page = mmap(0, 3 * 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(page, 0x90, 3 * 4096);
	page[8] = 0xc3; /* f = 8 nops + ret at page[0..8] */
	unsigned char *other = page + 2 * 4096;
	pthread_t e, w;
	pthread_create(&e, 0, exec_thread, 0);
	pthread_create(&w, 0, write_thread, (void *)rate);
	usleep(100000);
	const char *names[] = {"none", "same", "line+64", "page+2048", "other"};
	unsigned char *tg[] = {0, page + 4, page + 64 + 4, page + 2048, other};
	double sum[5] = {0}, wall[5] = {0}, srate[5] = {0};
	for (int r = 0; r < rounds; r++)
		for (int m = 0; m < 5; m++) {
		again:
			target = tg[m]; storing = m != 0;
			usleep(20000);
			unsigned long s0 = stores; unsigned long c0 = calls; double t0 = now(ecpu), w0 = now(CLOCK_MONOTONIC);
			usleep((useconds_t)(win * 1e6));
			unsigned long c1 = calls; double t1 = now(ecpu), w1 = now(CLOCK_MONOTONIC);
			if (t1 - t0 < 1e-3) { r--; goto again; } /* executor never ran: retake */
			sum[m] += (c1 - c0) / (t1 - t0);
			wall[m] += (t1 - t0) / (w1 - w0);
			srate[m] += (stores - s0) / (w1 - w0);
		}
	stopall = 1;
	pthread_join(e, 0); pthread_join(w, 0);
	for (int m = 0; m < 5; m++)
		printf("%-10s %.4g calls/CPU-s  x none %.3f  (executor on CPU %.0f%%, %.3g stores/s)\n", names[m], sum[m] / rounds, sum[m] / sum[0], 100 * wall[m] / rounds, srate[m] / rounds);
	return 0;
}
