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

/* A field of the home cache entry: rdx holds its offset from the first. */
#define L(field) EPA_TH_SIZE+field(%r9,%rdx)

	.hidden	edgeprobe_proc
	.hidden	ep_cyg_enter_full
	.hidden	ep_cyg_exit_full
	.hidden	ep_cyg_minmax_tail

/* ENTER_BODY / EXIT_BODY: the fast path proper, from the busy word on.
 * Each hook expands its body three times, so that each way in reaches it
 * without a taken branch: with count=1 where the control word's low byte is
 * exactly EP_CTL_NOTIME (counting only, nothing else on: the clock's test
 * is left out, D85), and with count=0 after the common test (no control bit
 * that needs the C; timed falls through, counting only jumps) and after the
 * trace filters' test (FILTERED_OUT). */
.macro ENTER_BODY count=0
	movq	(%rsp), %rax
	movq	%rax, %fs:EPA_TLS_BUSY_RET(%r8)
	leaq	-8(%rsp), %r10				/* here */
	movq	%r10, %fs:EPA_TLS_BUSY(%r8)
	/* the thread's cache entry at the key's home (D98): l = th + size + o,
	 * o = (key >> 4 & lmask) * 64 = key << 2 & lmask_off; the entry is
	 * addressed as L(field) = size + field(th, o) */
	leaq	(,%rdi,4), %rdx
	andl	edgeprobe_proc+EPA_PROC_LMASK_OFF(%rip), %edx	/* o */
	movl	EPA_TH_DEPTH(%r9), %ecx			/* d */
	cmpl	edgeprobe_proc+EPA_PROC_FAST_DEPTH(%rip), %ecx
	jae	.Lenter_decline				/* full stack, or no fast path at all */
	cmpq	%rdi, L(EPA_LOCAL_ADDR)
	jne	.Lenter_decline				/* not cached at its home */
	/* fr = frames + d * 48 (ep_tls.frames: th + stack_off) */
	leaq	(%rcx,%rcx,2), %rsi
	shlq	$4, %rsi
	addq	%fs:EPA_TLS_FRAMES(%r8), %rsi		/* fr */
	testl	%ecx, %ecx
	jz	1f
	cmpq	%r10, EPA_FR_SP-EPA_FR_SIZE(%rsi)	/* r10: here, since the busy word */
	jbe	.Lenter_decline				/* a frame to heal: at or below us */
1:	addq	$1, L(EPA_LOCAL_ENTRIES)		/* the owner's counter: no lock */
	movq	%rdi, EPA_FR_FN(%rsi)
	movq	%r10, EPA_FR_SP(%rsi)
	movq	%rax, EPA_FR_SITE(%rsi)			/* rax: the return address, since the busy word */
	movq	L(EPA_LOCAL_FRAME_IDS), %rdi
	movq	%rdi, EPA_FR_GIDX(%rsi)			/* gidx, loff = size + o */
	movq	%r11, %rax
	shrq	$32, %rax
	movq	%rax, EPA_FR_GEN(%rsi)			/* gen, flags 0 */
	.if !\count
	testb	$EPA_CTL_NOTIME, %r11b
	jnz	2f					/* counted only: below */
	rdtsc
	shlq	$32, %rdx
	orq	%rdx, %rax
	movq	%rax, EPA_FR_TS(%rsi)
	addl	$1, %ecx
	movl	%ecx, EPA_TH_DEPTH(%r9)			/* publishes the frame */
	movq	$0, %fs:EPA_TLS_BUSY(%r8)
	ret
	.endif
2:	movq	$0, EPA_FR_TS(%rsi)			/* counted only: untimed */
	addl	$1, %ecx
	movl	%ecx, EPA_TH_DEPTH(%r9)			/* publishes the frame */
	movq	$0, %fs:EPA_TLS_BUSY(%r8)
	ret
.endm

.macro EXIT_BODY count=0
	movq	(%rsp), %rax
	movq	%rax, %fs:EPA_TLS_BUSY_RET(%r8)
	leaq	-8(%rsp), %rax
	movq	%rax, %fs:EPA_TLS_BUSY(%r8)
	/* the top frame: fr = frames + (d - 1) * 48 */
	movl	EPA_TH_DEPTH(%r9), %ecx
	subl	$1, %ecx				/* d - 1 */
	cmpl	edgeprobe_proc+EPA_PROC_FAST_DEPTH(%rip), %ecx
	jae	.Lexit_decline				/* empty, beyond the stack, or no fast path */
	leaq	(%rcx,%rcx,2), %rsi
	shlq	$4, %rsi
	addq	%fs:EPA_TLS_FRAMES(%r8), %rsi		/* fr */
	cmpq	%rdi, EPA_FR_FN(%rsi)
	jne	.Lexit_decline				/* not this function's frame */
	movq	%r11, %rax
	shrq	$32, %rax
	cmpl	%eax, EPA_FR_GEN(%rsi)
	jne	.Lexit_decline				/* something was turned on since its enter */
	movl	EPA_FR_LOFF(%rsi), %edx			/* l = th + loff */
	testl	%edx, %edx
	jz	.Lexit_decline				/* loff 0: counted in the shared table */
	movl	%ecx, EPA_TH_DEPTH(%r9)			/* pop */
	addq	$1, EPA_LOCAL_EXITS(%r9,%rdx)
	.if \count
	movq	$0, %fs:EPA_TLS_BUSY(%r8)		/* counted only */
	ret
	.else
	testb	$EPA_CTL_NOTIME, %r11b
	jnz	7f					/* counted only */
	leaq	(%r9,%rdx), %rdi			/* l */
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
	.endif
.endm

/* FILTERED_OUT full, adj: the control word (r11) has a bit that sends hooks
 * to the C. When it is only tracing with filters (D32) and the filters leave
 * this hook's call out, fall through: the hook goes on as an untraced one,
 * as ep_untraced decides in C, so that a filtered-out call costs what a
 * counted one does. Otherwise jump to full. The test uses the thread's own
 * verdict on the filters (D58), made once per control|gen word by
 * FILTER_VERDICT: filter_out_cg, the word under which the thread list
 * leaves this thread out (every call out: one compare); else filter_lim_cg
 * and filter_lim, the word under which calls at depth filter_lim or deeper
 * (th->depth - adj) are out (~0: none). A capture starts a new generation
 * after it sets its filters (shm.Region.SetFilter), so no verdict outlives
 * the filters it was made from. Read before the busy word is set, as in C.
 * rax = header, r9 = th; clobbers rcx, rdx, rsi. */
.macro FILTERED_OUT full, adj
	cmpq	%r11, EPA_TH_FILTER_OUT_CG(%r9)
	je	10f					/* the thread list leaves this thread out */
	cmpq	%r11, EPA_TH_FILTER_LIM_CG(%r9)
	jne	11f					/* no verdict under this word: FILTER_VERDICT */
12:	movl	EPA_TH_DEPTH(%r9), %ecx
	subl	$\adj, %ecx				/* the call's depth */
	cmpl	EPA_TH_FILTER_LIM(%r9), %ecx
	jb	\full					/* within the depth: traced */
10:							/* out: on to the body */
.endm

/* FILTER_VERDICT full: the thread's verdict on the filters under the word
 * in r11 (the C's ep_untraced, once per word), placed after the hook's
 * body; back to FILTERED_OUT's tests. A limit is stored before the word
 * that makes it valid: a signal handler's hooks in between make the same
 * verdict, or one under a newer word, which this one never equals again
 * (gen only grows). */
.macro FILTER_VERDICT full
11:	movl	%r11d, %ecx
	andl	$(EPA_CTL_SLOWPATH|EPA_CTL_FILTER), %ecx
	cmpl	$(EPA_CTL_TRACE|EPA_CTL_FILTER), %ecx
	jne	\full					/* not only tracing with filters */
	movl	EPA_TH_TID(%r9), %ecx
	xorl	%esi, %esi
	movl	EPA_HDR_FILTER_TID(%rax), %edx
	testl	%edx, %edx
	jz	13f					/* no thread list: every thread */
9:	cmpl	%ecx, %edx
	je	13f					/* a listed thread */
	addl	$1, %esi
	cmpl	$EPA_FILTER_TIDS, %esi
	jae	14f
	movl	EPA_HDR_FILTER_TID(%rax,%rsi,4), %edx
	testl	%edx, %edx
	jnz	9b
14:	movq	%r11, EPA_TH_FILTER_OUT_CG(%r9)	/* not listed: every call out */
	jmp	10b
13:	movl	EPA_HDR_FILTER_DEPTH(%rax), %edx
	testl	%edx, %edx
	jnz	15f
	movl	$-1, %edx				/* no depth filter: every call traced */
15:	movl	%edx, EPA_TH_FILTER_LIM(%r9)
	movq	%r11, EPA_TH_FILTER_LIM_CG(%r9)
	jmp	12b
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
	cmpb	$EPA_CTL_NOTIME, %r11b
	jne	.Lenter_any				/* not counting only, or more than that */
	ENTER_BODY count=1
.Lenter_any:
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
	FILTER_VERDICT ep_cyg_enter_full
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
	cmpb	$EPA_CTL_NOTIME, %r11b
	jne	.Lexit_any				/* not counting only, or more than that */
	EXIT_BODY count=1
.Lexit_any:
	testb	$EPA_CTL_SLOWPATH, %r11b
	jnz	.Lexit_ctl
	EXIT_BODY
.Lexit_ctl:
	FILTERED_OUT ep_cyg_exit_full, 1
	EXIT_BODY
.Lexit_decline:
	movq	$0, %fs:EPA_TLS_BUSY(%r8)
	jmp	ep_cyg_exit_full
	FILTER_VERDICT ep_cyg_exit_full
	.cfi_endproc
	.size	__cyg_profile_func_exit, .-__cyg_profile_func_exit

	.section .note.GNU-stack, "", @progbits
