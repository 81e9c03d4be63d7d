/* counthooks.h: per-thread counting hooks shared by bench/toggle.c (defined
 * in bench/counthooks.c, a compilation unit of their own: a hook whose body
 * the compiler sees while compiling an instrumented caller forces the nop
 * placeholder, see internal/elfscan). */
#include <stdint.h>

#define MAXT 64

struct slot {
	volatile uint64_t calls, enters, exits;
	char pad[64 - 3 * sizeof(uint64_t)];
} __attribute__((aligned(64)));

extern struct slot slots[MAXT + 1]; /* slot MAXT: threads without a slot */
extern __thread struct slot *self;
