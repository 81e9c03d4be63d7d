/* emptyfentry.c: an empty __fentry__ (a bare ret) in a preloaded library,
 * the fentry counterpart of bench/emptyhooks.c in the provider-cost row
 * (row 1c). glibc's own __fentry__ is not empty: it saves the argument
 * registers and calls __mcount_internal, which returns at once when gmon
 * profiling is off; this one is the floor of an active fentry site (a call
 * through the PLT into a DSO, and back).
 *
 * Build: gcc -O2 -g -shared -fPIC bench/emptyfentry.c -o OUT
 */
__asm__(".text\n"
	".globl __fentry__\n"
	".type __fentry__, @function\n"
	"__fentry__:\n"
	"\tret\n"
	".size __fentry__, .-__fentry__\n");
