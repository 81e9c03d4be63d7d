/* demanglework.c: the second real workload of the provider-cost row (row
 * 1c): libiberty (binutils-2.40/libiberty from Debian's binutils-source,
 * extracted at bench time) demangles generated C++ symbol names with its
 * Itanium ABI demangler (cp-demangle.c, the recursive-descent parser behind
 * c++filt, nm -C and gdb), interns the results in a hashtab.c table, counts
 * them in a splay-tree.c tree and digests them with md5.c. Many small,
 * mutually recursive functions: the call-heavy shape of an interpreter,
 * unlike zlib's few long loops.
 *
 * Usage: demanglework N [ROUNDS]
 *   N       mangled names generated (deterministic: the same names on every
 *           run and in every build); each round demangles all of them
 *   ROUNDS  default 1
 * Output: "names N demangled D unique U chars C md5 HEX minbucket B xK" per
 *         round (the splay tree counts the results by length mod 256; B is
 *         its smallest key, K that key's count), then
 *         "ok SUM". Every variant's output must equal the uninstrumented
 *         build's. Exit 1 when a generated name does not demangle (a
 *         generator bug: every name is valid by construction).
 *
 * Only libiberty is instrumented: every function here carries
 * no_instrument_function (which also keeps -pg's __fentry__ call out).
 *
 * Build (internal/bench/provider.go runs these; L is binutils-2.40):
 *   gcc -O2 -g -DHAVE_STDLIB_H -DHAVE_STRING_H -DHAVE_LIMITS_H -DHAVE_STDINT_H
 *       -DSTDC_HEADERS -I L/include -c bench/demanglework.c -o demanglework.o
 *   gcc (the same flags) [-finstrument-functions | -pg -mfentry]
 *       -c L/libiberty/F.c -o F.o   (F: cp-demangle hashtab splay-tree md5
 *       safe-ctype)
 *   gcc -O2 -g demanglework.o F.o... -o OUT        (no -pg at link)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "demangle.h"
#include "hashtab.h"
#include "md5.h"
#include "splay-tree.h"

#define NOI __attribute__((no_instrument_function))

/* libiberty's allocation wrappers, which its routines call. */
NOI void *xmalloc(size_t n) {
	void *p = malloc(n ? n : 1);
	if (!p)
		abort();
	return p;
}
NOI void *xcalloc(size_t n, size_t m) {
	void *p = calloc(n ? n : 1, m ? m : 1);
	if (!p)
		abort();
	return p;
}
NOI void *xrealloc(void *p, size_t n) {
	p = realloc(p, n ? n : 1);
	if (!p)
		abort();
	return p;
}

static uint64_t rng = 0x2545f4914f6cdd1dull;

NOI static unsigned rnd(unsigned n) {
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (unsigned)((rng >> 11) % n);
}

struct buf {
	char *p;
	size_t n, cap;
};

NOI static void put(struct buf *b, const char *s) {
	size_t l = strlen(s);
	if (b->n + l + 1 > b->cap) {
		b->cap = (b->n + l + 1) * 2;
		b->p = xrealloc(b->p, b->cap);
	}
	memcpy(b->p + b->n, s, l + 1);
	b->n += l;
}

static const char *const ids[] = {
	"std", "vector", "map", "basic_string", "allocator", "pair", "tuple", "function", "shared_ptr",
	"edgeprobe", "probe", "Site", "Region", "Provider", "Builder", "Harness", "detail", "impl",
	"iterator", "const_iterator", "value_type", "operator_helper", "visit", "apply", "transform",
	"Node", "Tree", "Graph", "Edge", "Allocator", "Arena", "Parser", "Lexer", "Token", "Scope",
};

NOI static void sname(struct buf *b) {
	const char *id = ids[rnd(sizeof ids / sizeof ids[0])];
	char tmp[64];
	snprintf(tmp, sizeof tmp, "%zu%s", strlen(id), id);
	put(b, tmp);
}

NOI static void type(struct buf *b, int depth);

NOI static void targs(struct buf *b, int depth) {
	put(b, "I");
	int n = 1 + rnd(3);
	for (int i = 0; i < n; i++) {
		if (rnd(6) == 0) {
			char tmp[32];
			snprintf(tmp, sizeof tmp, "Li%uE", rnd(1000));
			put(b, tmp);
		} else
			type(b, depth + 1);
	}
	put(b, "E");
}

/* A class type: a source name, a template, or a nested name whose prefixes
 * may carry template arguments. */
NOI static void classtype(struct buf *b, int depth) {
	unsigned k = depth > 3 ? 0 : rnd(4);
	if (k == 0) {
		sname(b);
	} else if (k == 1) {
		sname(b);
		targs(b, depth);
	} else {
		put(b, "N");
		int n = 2 + rnd(3);
		for (int i = 0; i < n; i++) {
			sname(b);
			if (rnd(3) == 0 && depth < 3)
				targs(b, depth);
		}
		put(b, "E");
	}
}

NOI static void type(struct buf *b, int depth) {
	static const char *const builtin[] = {"b", "c", "a", "h", "s", "t", "i", "j", "l", "m", "x", "y", "f", "d", "e"};
	unsigned k = depth > 4 ? rnd(2) : rnd(12);
	switch (k) {
	case 0:
	case 1:
	case 2:
		put(b, builtin[rnd(sizeof builtin / sizeof builtin[0])]);
		break;
	case 3:
	case 4:
	case 5:
		classtype(b, depth);
		break;
	case 6:
	case 7:
		put(b, "P");
		type(b, depth + 1);
		break;
	case 8:
		put(b, "R");
		type(b, depth + 1);
		break;
	case 9:
		put(b, "PK");
		type(b, depth + 1);
		break;
	case 10: { /* pointer to function */
		put(b, "PF");
		type(b, depth + 1);
		int n = rnd(3);
		if (n == 0)
			put(b, "v");
		for (int i = 0; i < n; i++)
			type(b, depth + 1);
		put(b, "E");
		break;
	}
	default: { /* array */
		char tmp[32];
		snprintf(tmp, sizeof tmp, "A%u_", 1 + rnd(64));
		put(b, tmp);
		type(b, depth + 1);
	}
	}
}

/* One mangled function name: _Z, a (nested) name whose last component has
 * no template arguments (so no return type is mangled), the parameters. */
NOI static void mangled(struct buf *b) {
	put(b, "_Z");
	if (rnd(4) == 0) {
		sname(b);
	} else {
		put(b, rnd(4) == 0 ? "NK" : "N");
		int n = 1 + rnd(3);
		for (int i = 0; i < n; i++) {
			sname(b);
			if (rnd(3) == 0)
				targs(b, 1);
		}
		sname(b);
		put(b, "E");
	}
	int n = rnd(5);
	if (n == 0)
		put(b, "v");
	for (int i = 0; i < n; i++)
		type(b, 1);
}

NOI static int eq(const void *a, const void *b) { return strcmp(a, b) == 0; }
NOI static hashval_t hash(const void *a) { return htab_hash_string(a); }

NOI int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: demanglework N [ROUNDS]\n");
		return 2;
	}
	long n = strtol(argv[1], 0, 10);
	int rounds = argc > 2 ? atoi(argv[2]) : 1;
	struct buf all = {0};
	size_t *off = xmalloc(sizeof *off * (size_t)n);
	for (long i = 0; i < n; i++) {
		off[i] = all.n;
		mangled(&all);
		put(&all, " "); /* separator, replaced by NULs below */
	}
	for (size_t i = 0; i < all.n; i++)
		if (all.p[i] == ' ')
			all.p[i] = 0;
	uint32_t sum = 0;
	for (int r = 0; r < rounds; r++) {
		htab_t tab = htab_create(1024, hash, eq, free);
		splay_tree tree = splay_tree_new(splay_tree_compare_ints, 0, 0);
		struct md5_ctx md5;
		md5_init_ctx(&md5);
		long demangled = 0, chars = 0;
		for (long i = 0; i < n; i++) {
			const char *name = all.p + off[i];
			char *d = cplus_demangle_v3(name, DMGL_PARAMS | DMGL_ANSI | DMGL_TYPES);
			if (!d) {
				fprintf(stderr, "demanglework: %s does not demangle\n", name);
				return 1;
			}
			demangled++;
			size_t l = strlen(d);
			chars += (long)l;
			md5_process_bytes(d, l, &md5);
			void **slot = htab_find_slot(tab, d, INSERT);
			if (*slot)
				free(d);
			else
				*slot = d;
			splay_tree_key k = (splay_tree_key)(l & 255);
			splay_tree_node nd = splay_tree_lookup(tree, k);
			if (nd)
				nd->value++;
			else
				splay_tree_insert(tree, k, 1);
		}
		unsigned char dig[16];
		md5_finish_ctx(&md5, dig);
		char hex[33];
		for (int i = 0; i < 16; i++)
			snprintf(hex + 2 * i, 3, "%02x", dig[i]);
		long unique = (long)htab_elements(tab);
		splay_tree_node lo = splay_tree_min(tree);
		printf("names %ld demangled %ld unique %ld chars %ld md5 %s minbucket %ld x%ld\n", n, demangled, unique, chars, hex,
		       lo ? (long)lo->key : -1, lo ? (long)lo->value : 0);
		for (int i = 0; i < 16; i++)
			sum = sum * 31 + dig[i];
		sum += (uint32_t)unique;
		htab_delete(tab);
		splay_tree_delete(tree);
	}
	printf("ok %08x\n", sum);
	free(off);
	free(all.p);
	return 0;
}
