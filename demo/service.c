/* service.c: the demo's "production service". Four worker threads serve
 * synthetic key-value requests (parse, hash, look up, render) as fast as they
 * can until the file named by argv[1] appears; then it prints how many requests
 * it served and a checksum that does not depend on which probes were on.
 *
 * Built by scripts/demo.sh:
 *   gcc -O2 -g -pthread -finstrument-functions demo/service.c -o out/demo/service
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define WORKERS 4
#define TABLE 1024

struct request {
	char key[32];
	int op;
};

static uint64_t table[TABLE];
static atomic_int stop, ready;

__attribute__((noinline)) static void parse_request(uint64_t seq, struct request *r) {
	r->op = (int)(seq % 3);
	snprintf(r->key, sizeof r->key, "user:%llu", (unsigned long long)(seq * 2654435761u % 100000));
}

__attribute__((noinline)) static uint64_t hash_key(const char *k) {
	uint64_t h = 1469598103934665603ull;
	while (*k)
		h = (h ^ (unsigned char)*k++) * 1099511628211ull;
	return h;
}

__attribute__((noinline)) uint64_t lookup(const struct request *r) {
	uint64_t h = hash_key(r->key);
	return __atomic_load_n(&table[h % TABLE], __ATOMIC_RELAXED) ^ h;
}

__attribute__((noinline)) void store(const struct request *r, uint64_t v) {
	__atomic_store_n(&table[hash_key(r->key) % TABLE], v, __ATOMIC_RELAXED);
}

__attribute__((noinline)) size_t render_response(char *buf, size_t n, uint64_t v) {
	return (size_t)snprintf(buf, n, "{\"value\":%llu}", (unsigned long long)v);
}

__attribute__((noinline)) uint64_t handle_request(uint64_t seq) {
	struct request r;
	char out[64];
	parse_request(seq, &r);
	uint64_t v = r.op == 2 ? (store(&r, seq), seq) : lookup(&r);
	return render_response(out, sizeof out, v) + (uint8_t)out[1];
}

static void *worker(void *arg) {
	uint64_t id = (uint64_t)(uintptr_t)arg, served = 0;
	atomic_fetch_add(&ready, 1);
	for (uint64_t seq = id; !atomic_load_explicit(&stop, memory_order_relaxed); seq += WORKERS) {
		handle_request(seq);
		served++;
	}
	return (void *)(uintptr_t)served;
}

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: %s STOPFILE\n", argv[0]);
		return 2;
	}
	pthread_t th[WORKERS];
	for (uintptr_t i = 0; i < WORKERS; i++)
		pthread_create(&th[i], NULL, worker, (void *)i);
	while (atomic_load(&ready) < WORKERS)
		sched_yield();
	printf("service: pid %d serving with %d workers\n", getpid(), WORKERS);
	fflush(stdout);
	while (access(argv[1], F_OK) != 0)
		usleep(10000);
	atomic_store(&stop, 1);
	uint64_t served = 0;
	for (int i = 0; i < WORKERS; i++) {
		void *r;
		pthread_join(th[i], &r);
		served += (uintptr_t)r;
	}
	printf("service: served %llu requests\n", (unsigned long long)served);
	return 0;
}
