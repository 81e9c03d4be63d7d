/* emptyhooks.c: empty -finstrument-functions hooks in a preloaded library,
 * the "empty handler" of the invocation-cost row: the same call path as the
 * edgeprobe runtime (a PLT call into a preloaded DSO), with no work in it.
 *
 * Build: gcc -O2 -g -shared -fPIC bench/emptyhooks.c -o OUT
 */
__attribute__((no_instrument_function, noinline)) void __cyg_profile_func_enter(void *fn, void *site) {
	(void)fn, (void)site;
	__asm__ volatile("");
}

__attribute__((no_instrument_function, noinline)) void __cyg_profile_func_exit(void *fn, void *site) {
	(void)fn, (void)site;
	__asm__ volatile("");
}
