/* toggle.c: the target the harness toggles probes in (probe activation and
 * deactivation costs, and throughput under toggling, the paper's Figure 12).
 *
 * Usage: toggle THREADS [CPU]
 *   THREADS executor threads (0..64) call the instrumented probed() in a loop
 *           and count their calls; CPU, if given and >= 0, pins them there.
 * It prints "ready PID" once every executor runs, then serves stdin commands:
 *   calls   print "calls C enters E exits X cpu NS" (totals so far, relaxed
 *           reads; NS is the executors' CPU time, read through
 *           pthread_getcpuclockid, so a busy machine's lost time can be
 *           told from the cost of cross-modification)
 *   quit    stop the executors, print the final "calls ..." line, exit 0
 * EOF on stdin is quit. The counting hooks are in bench/counthooks.c (their
 * own compilation unit); only probed() is instrumented (main and the
 * executors are not), so the probe list holds exactly probed()'s entry and
 * exit sites.
 * A SIGILL/SIGSEGV/SIGBUS/SIGTRAP/SIGFPE (a torn site) prints "torn SIG" and
 * exits 86.
 *
 * Build: gcc -O2 -g -pthread -finstrument-functions bench/toggle.c \
 *            bench/counthooks.c -o OUT
 *        (then coldpatch OUT; internal/bench/build.go runs exactly this)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOI __attribute__((no_instrument_function))
#include "counthooks.h"

static volatile int stop;
static int cpu = -1;
static pthread_barrier_t started;

__attribute__((noinline)) void probed(void) { __asm__ volatile(""); }

NOI static void *executor(void *arg) {
	struct slot *s = arg;
	self = s;
	if (cpu >= 0) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(cpu, &set);
		pthread_setaffinity_np(pthread_self(), sizeof set, &set);
	}
	pthread_barrier_wait(&started);
	while (!stop) {
		for (int i = 0; i < 256; i++)
			probed();
		s->calls += 256;
	}
	return NULL;
}

static pthread_t th[MAXT];

NOI static void report(int n) {
	uint64_t c = 0, e = 0, x = 0, cpu_ns = 0;
	for (int i = 0; i < n; i++) {
		clockid_t id;
		struct timespec ts;
		if (pthread_getcpuclockid(th[i], &id) == 0 && clock_gettime(id, &ts) == 0)
			cpu_ns += (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	}
	for (int i = 0; i <= n && i <= MAXT; i++) {
		c += slots[i].calls;
		e += slots[i].enters;
		x += slots[i].exits;
	}
	e += slots[MAXT].enters, x += slots[MAXT].exits;
	printf("calls %llu enters %llu exits %llu cpu %llu\n", (unsigned long long)c,
	       (unsigned long long)e, (unsigned long long)x, (unsigned long long)cpu_ns);
	fflush(stdout);
}

NOI static void torn(int sig) {
	char msg[32];
	int k = snprintf(msg, sizeof msg, "torn %d\n", sig);
	if (write(1, msg, (size_t)k) < 0)
		_exit(87);
	_exit(86);
}

NOI int main(int argc, char **argv) {
	int n = argc > 1 ? atoi(argv[1]) : 1;
	if (argc > 2)
		cpu = atoi(argv[2]);
	if (n < 0 || n > MAXT)
		n = 1;
	int sigs[] = {SIGILL, SIGSEGV, SIGBUS, SIGTRAP, SIGFPE};
	for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
		signal(sigs[i], torn);
	pthread_barrier_init(&started, NULL, (unsigned)n + 1);
	for (int i = 0; i < n; i++)
		pthread_create(&th[i], NULL, executor, &slots[i]);
	pthread_barrier_wait(&started);
	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	char line[64];
	while (fgets(line, sizeof line, stdin)) {
		if (strncmp(line, "calls", 5) == 0)
			report(n);
		else if (strncmp(line, "quit", 4) == 0)
			break;
	}
	stop = 1;
	report(n); /* before the joins: a joined thread has no CPU clock */
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	return 0;
}
