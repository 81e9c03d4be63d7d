/* edgeprobe_cyg.S: the -finstrument-functions hooks' common case, in
 * assembly (D33). __cyg_profile_func_enter and __cyg_profile_func_exit
 * here do exactly what ep_enter_fast / ep_exit_fast (edgeprobe_internal.h)
 * do when the control word sends no hook to the general path, with the
 * caller-saved registers only: no stack frame, no callee-saved register
 * saved and restored (gcc's version of the same C kept four, eight memory
 * operations per hook). Everything else, and every case the fast path
 * declines, jumps to the C hooks (ep_cyg_enter_full / ep_cyg_exit_full in
 * edgeprobe_cyg.c) with the stack pointer and the arguments as they came,
 * so that the C runs exactly as if it had been called by the instrumented
 * function: its frame address is this hook's, the busy word names it.
 *
 * Owns nothing the C does not: the busy word is set before any per-thread
 * state is read and cleared last (a signal handler's hooks see it), the
 * frame is written before the depth that publishes it, and a decline after
 * the busy word was set clears it first and writes nothing else.
 *
 * Layout constants: edgeprobe_asm.h, checked against the C structs in
 * edgeprobe_cyg.c. The stack pointer is never moved, so the default unwind
 * rule (CFA = rsp + 8) holds at every instruction.
 */
#include "edgeprobe_asm.h"

	.hidden	edgeprobe_proc
	.hidden	ep_cyg_enter_full
	.hidden	ep_cyg_exit_full
	.hidden	ep_cyg_minmax_tail

/* ENTER_BODY / EXIT_BODY: the fast path proper, from the busy word on.
 * Each hook expands its body twice: after the common test (no control bit
 * that needs the C) and after the trace filters' test (FILTERED_OUT), so
 * that either reaches it without a taken branch. */
.macro ENTER_BODY
	movq	(%rsp), %rax
	movq	%rax, %fs:EPA_TLS_BUSY_RET(%r8)
	leaq	-8(%rsp), %r10				/* here */
	movq	%r10, %fs:EPA_TLS_BUSY(%r8)
	/* the thread's cache entry at the key's home: l = th + size + i * 48 */
	movabsq	$EPA_HASH_MULT, %rax
	imulq	%rdi, %rax
	shrq	$40, %rax
	andl	edgeprobe_proc+EPA_PROC_LMASK(%rip), %eax	/* i */
	leaq	(%rax,%rax,2), %rdx
	shlq	$4, %rdx
	leaq	EPA_TH_SIZE(%r9,%rdx), %rdx		/* l */
	movl	EPA_TH_DEPTH(%r9), %ecx			/* d */
	cmpl	edgeprobe_proc+EPA_PROC_FAST_DEPTH(%rip), %ecx
	jae	.Lenter_decline				/* full stack, or no fast path at all */
	cmpq	%rdi, EPA_LOCAL_ADDR(%rdx)
	jne	.Lenter_decline				/* not cached at its home */
	/* fr = th + stack_off + d * 48 */
	leaq	(%rcx,%rcx,2), %rsi
	shlq	$4, %rsi
	addq	%r9, %rsi
	movl	edgeprobe_proc+EPA_PROC_STACK_OFF(%rip), %r10d
	addq	%r10, %rsi				/* fr */
	leaq	-8(%rsp), %r10				/* here again */
	testl	%ecx, %ecx
	jz	1f
	cmpq	%r10, EPA_FR_SP-EPA_FR_SIZE(%rsi)
	jbe	.Lenter_decline				/* a frame to heal: at or below us */
1:	addq	$1, EPA_LOCAL_ENTRIES(%rdx)		/* the owner's counter: no lock */
	movq	%rdi, EPA_FR_FN(%rsi)
	movq	%r10, EPA_FR_SP(%rsi)
	movq	(%rsp), %rdi
	movq	%rdi, EPA_FR_SITE(%rsi)
	movl	EPA_LOCAL_GIDX(%rdx), %edi
	addl	$1, %eax				/* lidx = i + 1 */
	shlq	$32, %rax
	orq	%rax, %rdi
	movq	%rdi, EPA_FR_GIDX(%rsi)			/* gidx, lidx */
	movq	%r11, %rax
	shrq	$32, %rax
	movq	%rax, EPA_FR_GEN(%rsi)			/* gen, flags 0 */
	xorl	%eax, %eax
	testb	$EPA_CTL_NOTIME, %r11b
	jnz	2f
	rdtsc
	shlq	$32, %rdx
	orq	%rdx, %rax
2:	movq	%rax, EPA_FR_TS(%rsi)
	addl	$1, %ecx
	movl	%ecx, EPA_TH_DEPTH(%r9)			/* publishes the frame */
	movq	$0, %fs:EPA_TLS_BUSY(%r8)
	ret
.endm

.macro EXIT_BODY
	movq	(%rsp), %rax
	movq	%rax, %fs:EPA_TLS_BUSY_RET(%r8)
	leaq	-8(%rsp), %rax
	movq	%rax, %fs:EPA_TLS_BUSY(%r8)
	/* the top frame: fr = th + stack_off + (d - 1) * 48 */
	movl	EPA_TH_DEPTH(%r9), %ecx
	subl	$1, %ecx				/* d - 1 */
	cmpl	edgeprobe_proc+EPA_PROC_FAST_DEPTH(%rip), %ecx
	jae	.Lexit_decline				/* empty, beyond the stack, or no fast path */
	leaq	(%rcx,%rcx,2), %rsi
	shlq	$4, %rsi
	addq	%r9, %rsi
	movl	edgeprobe_proc+EPA_PROC_STACK_OFF(%rip), %eax
	addq	%rax, %rsi				/* fr */
	cmpq	%rdi, EPA_FR_FN(%rsi)
	jne	.Lexit_decline				/* not this function's frame */
	movq	%r11, %rax
	shrq	$32, %rax
	cmpl	%eax, EPA_FR_GEN(%rsi)
	jne	.Lexit_decline				/* something was turned on since its enter */
	movl	EPA_FR_LIDX(%rsi), %edx
	testl	%edx, %edx
	jz	.Lexit_decline				/* counted in the shared table */
	/* l = th + size + (lidx - 1) * 48 */
	leaq	(%rdx,%rdx,2), %rdx
	shlq	$4, %rdx
	leaq	EPA_TH_SIZE-EPA_LOCAL_SIZE(%r9,%rdx), %rdi	/* l */
	movl	%ecx, EPA_TH_DEPTH(%r9)			/* pop */
	addq	$1, EPA_LOCAL_EXITS(%rdi)
	testb	$EPA_CTL_NOTIME, %r11b
	jnz	7f
	movq	EPA_FR_TS(%rsi), %r9
	testq	%r9, %r9
	jz	7f					/* entered untimed */
	/* ns = (now - ts) * tsc_mult >> 32, 0 if the clock went back */
	rdtsc
	shlq	$32, %rdx
	orq	%rdx, %rax
	xorl	%ecx, %ecx
	subq	%r9, %rax
	jbe	3f
	mulq	edgeprobe_proc+EPA_PROC_TSC_MULT(%rip)
	shrdq	$32, %rdx, %rax
	movq	%rax, %rcx				/* ns */
3:	addq	%rcx, EPA_LOCAL_SUM_NS(%rdi)
	/* f = funcs + gidx * 576 */
	movl	EPA_FR_GIDX(%rsi), %eax
	leaq	(%rax,%rax,8), %rax
	shlq	$6, %rax
	addq	edgeprobe_proc+EPA_PROC_FUNCS(%rip), %rax	/* f */
	/* the histogram through the cache entry's hint (D30): the add's
	 * address comes from the hint, known before the clock read; the
	 * bucket only decides a branch */
	movl	EPA_LOCAL_HINT(%rdi), %r9d
	movq	%rcx, %rdx
	orq	$1, %rdx
	bsrq	%rdx, %rdx				/* b */
	movl	$EPA_HIST_LAST, %esi
	cmpl	%esi, %edx
	cmova	%esi, %edx
	cmpl	%esi, %r9d
	ja	4f					/* a hint out of range: not used */
	cmpl	%edx, %r9d
	jne	4f
	lock addq $1, EPA_FUNC_HIST(%rax,%r9,8)
	jmp	5f
4:	lock addq $1, EPA_FUNC_HIST(%rax,%rdx,8)
	movl	%edx, EPA_LOCAL_HINT(%rdi)
5:	/* min and max: only a new extreme needs the C (a CAS loop) */
	cmpq	EPA_FUNC_MAX_NS(%rax), %rcx
	ja	6f
	movq	%rcx, %rdx
	notq	%rdx
	cmpq	EPA_FUNC_MIN_INV(%rax), %rdx
	ja	6f
7:
	movq	$0, %fs:EPA_TLS_BUSY(%r8)
	ret
6:	movq	%rax, %rdi
	movq	%rcx, %rsi
	jmp	ep_cyg_minmax_tail			/* clears the busy word */
.endm

/* FILTERED_OUT full, adj: the control word (r11) has a bit that sends hooks
 * to the C. When it is only tracing with filters (D32) and the filters leave
 * this hook's call out (its depth, th->depth - adj, at or past filter_depth,
 * or a thread list without this thread), fall through: the hook goes on as
 * an untraced one, as ep_untraced decides in C, so that a filtered-out call
 * costs about what a counted one does. Otherwise jump to full. Read before
 * the busy word is set, as in C. rax = header, r9 = th; clobbers rcx, rdx,
 * rsi. The common filters (one thread, or a depth) take no taken branch. */
.macro FILTERED_OUT full, adj
	movl	%r11d, %ecx
	andl	$(EPA_CTL_SLOWPATH|EPA_CTL_FILTER), %ecx
	cmpl	$(EPA_CTL_TRACE|EPA_CTL_FILTER), %ecx
	jne	\full
	movq	EPA_HDR_FILTER_DEPTH(%rax), %rdx	/* filter_depth | filter_tid[0] << 32 */
	movl	EPA_TH_DEPTH(%r9), %ecx
	subl	$\adj, %ecx				/* the call's depth */
	cmpl	%edx, %ecx
	jb	8f					/* within the depth (or no depth filter: 0) */
	testl	%edx, %edx
	jnz	10f					/* too deep: out */
8:	shrq	$32, %rdx
	jz	\full					/* no thread list: traced */
	cmpl	EPA_TH_TID(%r9), %edx
	je	\full					/* the listed thread */
	cmpl	$0, EPA_HDR_FILTER_TID+4(%rax)
	jne	11f					/* more threads listed: FILTER_LIST */
10:							/* out: fall through to the body */
.endm

/* FILTER_LIST full: the rest of FILTERED_OUT's thread list (a second
 * thread and more), placed after the hook's body so that a list of one
 * costs no jump; back to FILTERED_OUT's end (10) when the call is out. */
.macro FILTER_LIST full
11:	movl	EPA_TH_TID(%r9), %ecx
	movl	$1, %esi
9:	movl	EPA_HDR_FILTER_TID(%rax,%rsi,4), %edx
	testl	%edx, %edx
	jz	10b					/* end of the list: out */
	cmpl	%ecx, %edx
	je	\full					/* a listed thread */
	addl	$1, %esi
	cmpl	$EPA_FILTER_TIDS, %esi
	jb	9b
	jmp	10b
.endm

	.text

/* void __cyg_profile_func_enter(void *fn, void *site)
 * rdi = fn (the key), (%rsp) = return address into the instrumented function.
 * here = rsp - 8: the frame address a C hook would have (ep_cyg_hook's "here"). */
	.globl	__cyg_profile_func_enter
	.type	__cyg_profile_func_enter, @function
	.p2align 5
__cyg_profile_func_enter:
	.cfi_startproc
	movq	ep_tls@gottpoff(%rip), %r8
	movq	%fs:EPA_TLS_SLOT(%r8), %r9		/* th */
	cmpq	$EPA_SLOT_MIN-1, %r9
	jbe	ep_cyg_enter_full			/* no slot yet, or none to be had */
	cmpq	$0, %fs:EPA_TLS_BUSY(%r8)
	jne	ep_cyg_enter_full			/* inside a hook (a signal), or a stale word */
	movq	edgeprobe_proc+EPA_PROC_HDR(%rip), %rax
	movq	EPA_HDR_CONTROL(%rax), %r11		/* control | gen << 32 */
	testb	$EPA_CTL_SLOWPATH, %r11b
	jnz	.Lenter_ctl
	ENTER_BODY
.Lenter_ctl:
	FILTERED_OUT ep_cyg_enter_full, 0
	ENTER_BODY
.Lenter_decline:
	/* rdi still holds fn: the C hook starts over (it sets the word again) */
	movq	$0, %fs:EPA_TLS_BUSY(%r8)
	jmp	ep_cyg_enter_full
	FILTER_LIST ep_cyg_enter_full
	.cfi_endproc
	.size	__cyg_profile_func_enter, .-__cyg_profile_func_enter

/* void __cyg_profile_func_exit(void *fn, void *site) */
	.globl	__cyg_profile_func_exit
	.type	__cyg_profile_func_exit, @function
	.p2align 5
__cyg_profile_func_exit:
	.cfi_startproc
	movq	ep_tls@gottpoff(%rip), %r8
	movq	%fs:EPA_TLS_SLOT(%r8), %r9		/* th */
	cmpq	$EPA_SLOT_MIN-1, %r9
	jbe	ep_cyg_exit_full
	cmpq	$0, %fs:EPA_TLS_BUSY(%r8)
	jne	ep_cyg_exit_full
	movq	edgeprobe_proc+EPA_PROC_HDR(%rip), %rax
	movq	EPA_HDR_CONTROL(%rax), %r11		/* control | gen << 32 */
	testb	$EPA_CTL_SLOWPATH, %r11b
	jnz	.Lexit_ctl
	EXIT_BODY
.Lexit_ctl:
	FILTERED_OUT ep_cyg_exit_full, 1
	EXIT_BODY
.Lexit_decline:
	movq	$0, %fs:EPA_TLS_BUSY(%r8)
	jmp	ep_cyg_exit_full
	FILTER_LIST ep_cyg_exit_full
	.cfi_endproc
	.size	__cyg_profile_func_exit, .-__cyg_profile_func_exit

	.section .note.GNU-stack, "", @progbits
