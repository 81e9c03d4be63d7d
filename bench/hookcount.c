/* hookcount.c: a preloaded library that counts every hook a program
 * reaches, for the provider-cost row's checks (row 1c): the inert builds
 * must reach none, the active ones must reach theirs (which also proves the
 * preload interposes on the hook, so a zero means something).
 *
 * It defines __cyg_profile_func_enter/_exit and __fentry__ (a counter
 * increment and a ret: it touches no argument register, and the flags are
 * dead at a function's first instruction) and, at exit, writes
 * "hookcount cyg_enter=N cyg_exit=N fentry=N" to the file named by
 * HOOKCOUNT_OUT (nothing when unset), never to the program's stdout.
 * Single-threaded targets only (plain increments).
 *
 * Build: gcc -O2 -g -shared -fPIC bench/hookcount.c -o OUT
 */
#include <stdio.h>
#include <stdlib.h>

__attribute__((visibility("hidden"))) unsigned long hookcount_fentry;
static unsigned long cyg_enter, cyg_exit;

__attribute__((no_instrument_function)) void __cyg_profile_func_enter(void *fn, void *site) {
	(void)fn, (void)site;
	cyg_enter++;
}

__attribute__((no_instrument_function)) void __cyg_profile_func_exit(void *fn, void *site) {
	(void)fn, (void)site;
	cyg_exit++;
}

__asm__(".text\n"
	".globl __fentry__\n"
	".type __fentry__, @function\n"
	"__fentry__:\n"
	"\tincq hookcount_fentry(%rip)\n"
	"\tret\n"
	".size __fentry__, .-__fentry__\n");

__attribute__((no_instrument_function, destructor)) static void report(void) {
	const char *path = getenv("HOOKCOUNT_OUT");
	if (!path)
		return;
	FILE *f = fopen(path, "w");
	if (!f)
		return;
	fprintf(f, "hookcount cyg_enter=%lu cyg_exit=%lu fentry=%lu\n", cyg_enter, cyg_exit, hookcount_fentry);
	fclose(f);
}
