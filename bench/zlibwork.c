/* zlibwork.c: the real-workload driver of the provider-cost row (row 1c):
 * zlib 1.2.13 (binutils-2.40/zlib from Debian's binutils-source, extracted
 * at bench time) deflates, then inflates, a generated corpus at levels 1, 6
 * and 9, and the round trip is checked byte for byte.
 *
 * Usage: zlibwork KB [ROUNDS]
 *   KB      corpus size in KiB (deterministic: the same bytes on every run
 *           and in every build)
 *   ROUNDS  times the three levels are run (default 1)
 * Output: one line per level and round, "level L in N out M crc C" (C is the
 *         CRC-32 of the compressed stream), then "ok SUM" (SUM folds every
 *         line). Every variant's output must equal the uninstrumented
 *         build's: the instrumentation, hot or cold, must not change what
 *         the program computes. Exit 1 on a zlib error or a bad round trip.
 *
 * The corpus is text-like: words drawn with a skewed distribution from a
 * small vocabulary, numbers and punctuation, with a short run of
 * pseudo-random bytes every ~16 KiB; zlib compresses it about 3-4x at
 * level 6. Compression and decompression stream through 32 KiB input and
 * 16 KiB output windows, so zlib's per-call paths (deflate(), inflate(),
 * flush_pending, the window slides) run as they do in a real pipe.
 *
 * Only zlib is instrumented: every function here carries
 * no_instrument_function (which also keeps -pg's __fentry__ call out), so
 * each variant differs from the uninstrumented build in zlib's code alone.
 *
 * Build (internal/bench/provider.go runs these; Z is the extracted zlib):
 *   gcc -O2 -g -c bench/zlibwork.c -I Z -o zlibwork.o
 *   gcc -O2 -g [-finstrument-functions | -pg -mfentry] -c Z/F.c -o F.o
 *       (F: adler32 compress crc32 deflate infback inffast inflate
 *        inftrees trees uncompr zutil)
 *   gcc -O2 -g zlibwork.o F.o... -o OUT        (no -pg at link)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zlib.h"

#define NOI __attribute__((no_instrument_function))

static uint64_t rng = 0x9e3779b97f4a7c15ull;

NOI static uint64_t next(void) {
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static const char *const words[] = {
	"the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
	"probe", "function", "entry", "exit", "site", "call", "return", "compiler", "inert", "active", "patch",
	"byte", "instruction", "register", "stack", "frame", "thread", "process", "memory", "page", "cache",
	"deflate", "inflate", "window", "match", "literal", "distance", "length", "huffman", "tree", "block",
	"benchmark", "median", "spread", "overhead", "baseline", "variant", "provider", "runtime", "handler",
};

NOI static void corpus(unsigned char *buf, size_t n) {
	size_t i = 0, nw = sizeof words / sizeof words[0];
	while (i < n) {
		uint64_t r = next();
		if ((r & 0x3fff) == 0) { /* ~every 16K draws: 64 noisy bytes */
			for (int k = 0; k < 64 && i < n; k++)
				buf[i++] = (unsigned char)next();
			continue;
		}
		const char *w;
		char num[24];
		switch ((r >> 16) & 15) {
		case 0:
			snprintf(num, sizeof num, "%u", (unsigned)((r >> 24) % 100000));
			w = num;
			break;
		default: { /* skewed: low indices far more often */
			size_t a = (r >> 24) % nw, b = (r >> 40) % nw;
			w = words[a < b ? a : b];
		}
		}
		for (; *w && i < n; w++)
			buf[i++] = (unsigned char)*w;
		if (i < n)
			buf[i++] = ((r >> 20) & 31) == 0 ? '\n' : ((r >> 20) & 31) == 1 ? ',' : ' ';
	}
}

NOI static int fail(const char *what, int rc) {
	fprintf(stderr, "zlibwork: %s: %d\n", what, rc);
	exit(1);
}

/* squeeze deflates in (n bytes) into out (cap bytes) at level; returns the
 * compressed size. */
NOI static size_t squeeze(const unsigned char *in, size_t n, unsigned char *out, size_t cap, int level) {
	z_stream s;
	memset(&s, 0, sizeof s);
	int rc = deflateInit(&s, level);
	if (rc != Z_OK)
		fail("deflateInit", rc);
	size_t pos = 0, outpos = 0;
	do {
		size_t chunk = n - pos < 32768 ? n - pos : 32768;
		s.next_in = (unsigned char *)in + pos;
		s.avail_in = (uInt)chunk;
		pos += chunk;
		int flush = pos == n ? Z_FINISH : Z_NO_FLUSH;
		do {
			size_t room = cap - outpos < 16384 ? cap - outpos : 16384;
			s.next_out = out + outpos;
			s.avail_out = (uInt)room;
			rc = deflate(&s, flush);
			if (rc == Z_STREAM_ERROR)
				fail("deflate", rc);
			outpos += room - s.avail_out;
		} while (s.avail_out == 0);
	} while (pos < n);
	if (rc != Z_STREAM_END)
		fail("deflate end", rc);
	deflateEnd(&s);
	return outpos;
}

NOI static size_t expand(const unsigned char *in, size_t n, unsigned char *out, size_t cap) {
	z_stream s;
	memset(&s, 0, sizeof s);
	int rc = inflateInit(&s);
	if (rc != Z_OK)
		fail("inflateInit", rc);
	size_t pos = 0, outpos = 0;
	do {
		size_t chunk = n - pos < 32768 ? n - pos : 32768;
		s.next_in = (unsigned char *)in + pos;
		s.avail_in = (uInt)chunk;
		pos += chunk;
		do {
			size_t room = cap - outpos < 16384 ? cap - outpos : 16384;
			if (room == 0)
				fail("inflate: output larger than the corpus", 0);
			s.next_out = out + outpos;
			s.avail_out = (uInt)room;
			rc = inflate(&s, Z_NO_FLUSH);
			if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
				fail("inflate", rc);
			outpos += room - s.avail_out;
		} while (s.avail_out == 0 && rc != Z_STREAM_END);
	} while (rc != Z_STREAM_END && pos < n);
	if (rc != Z_STREAM_END)
		fail("inflate end", rc);
	inflateEnd(&s);
	return outpos;
}

NOI int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: zlibwork KB [ROUNDS]\n");
		return 2;
	}
	size_t n = (size_t)strtoul(argv[1], 0, 10) * 1024;
	int rounds = argc > 2 ? atoi(argv[2]) : 1;
	size_t cap = compressBound((uLong)n);
	unsigned char *in = malloc(n), *z = malloc(cap), *back = malloc(n + 1);
	if (!in || !z || !back)
		fail("malloc", 0);
	corpus(in, n);
	static const int levels[] = {1, 6, 9};
	uint32_t sum = 0;
	for (int r = 0; r < rounds; r++) {
		for (int l = 0; l < 3; l++) {
			size_t zn = squeeze(in, n, z, cap, levels[l]);
			size_t bn = expand(z, zn, back, n + 1);
			if (bn != n || memcmp(in, back, n) != 0)
				fail("round trip differs at level", levels[l]);
			uint32_t crc = (uint32_t)crc32(0, z, (uInt)zn);
			printf("level %d in %zu out %zu crc %08x\n", levels[l], n, zn, crc);
			sum = sum * 31 + crc + (uint32_t)zn;
		}
	}
	printf("ok %08x\n", sum);
	return 0;
}
