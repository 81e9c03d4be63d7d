/* counthooks.c: counting -finstrument-functions hooks for bench/toggle.c;
 * each thread counts into its own cache line (self, set by the executor).
 * Build: with toggle.c, in the same command (see there); the hooks carry
 * no_instrument_function, so -finstrument-functions leaves them alone. */
#include "counthooks.h"

struct slot slots[MAXT + 1];
__thread struct slot *self = &slots[MAXT];

__attribute__((no_instrument_function)) void __cyg_profile_func_enter(void *fn, void *site) {
	(void)fn, (void)site;
	self->enters++;
}

__attribute__((no_instrument_function)) void __cyg_profile_func_exit(void *fn, void *site) {
	(void)fn, (void)site;
	self->exits++;
}
