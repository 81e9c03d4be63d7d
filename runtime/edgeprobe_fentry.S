/* edgeprobe_fentry.S: the fentry provider's entry (__fentry__) and its return
 * trampoline (ep_fentry_return). The C halves are in edgeprobe_fentry.c;
 * docs/runtime.md describes the design.
 *
 * __fentry__ is called by the first instruction of every function built with
 * -pg -mfentry (after endbr64 under -fcf-protection), before the prologue:
 *     [rsp]     return address into the probed function (just after the call)
 *     [rsp+8]   the probed function's own return address (its "slot")
 *     rsp = 0 mod 16 (the call precedes the prologue; aligned explicitly anyway)
 * Every argument register is live: rdi rsi rdx rcx r8 r9, rax (al = vector
 * count of a varargs call), r10 (static chain), xmm0-7 and the upper halves of
 * ymm/zmm0-7 (__m256/__m512 arguments). The fast path saves the integer ones
 * only: the runtime's C is compiled general-regs-only (the compiler never emits
 * an xmm instruction there), and the fast path calls nothing in libc except
 * the vDSO clock_gettime (general registers only too). When the C fast path
 * cannot finish (first hook of a thread: the slot claim and region set-up
 * call into libc, whose AVX2 string functions end in vzeroupper), it returns
 * 1 and the slow path saves the whole vector state with xsave before calling
 * C. Measured: saving xmm0-7 on every call cost 1.7 ns of 7.2.
 *
 * ep_fentry_return is where a hijacked function returns to (rsp = slot + 8).
 * Return values are live in rax, rdx, xmm0, xmm1 (and ymm0/zmm0, st0, st1);
 * C returns the original return address and the trampoline jumps there. It
 * saves rax, rdx, xmm0 and xmm1 (cheap insurance: the C is GPR-only), x87
 * and the upper halves only on the slow path (xsave). Its
 * unwind entry (FDE) says "CFA = rsp, return address at CFA-8" and names a
 * personality routine, ep_fentry_personality, which the unwinder calls for
 * this frame before it reads the return address: the personality writes the
 * original return address back into the slot, so exceptions, pthread_exit
 * and pthread_cancel unwind through hijacked frames. The FDE starts one byte
 * before ep_fentry_return because unwinders look up return address - 1.
 */
	.text

/* Save the full vector (and x87) state below rsp, 64-byte aligned; clobbers
 * rax, rdx and rsp. ep_vsave_size is the xsave (or fxsave) area size for the
 * components of mask 0xe7 (x87, SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM),
 * computed by ep_vsave_init (C, no libc) on first use. */
.macro VSAVE
	andq	$-64, %rsp
	movl	ep_vsave_size(%rip), %eax
	testl	%eax, %eax
	jnz	1f
	call	ep_vsave_init
1:	subq	%rax, %rsp
	cmpl	$0, ep_vsave_xsave(%rip)
	je	2f
	xorl	%eax, %eax
	movq	%rax, 512(%rsp)		/* xsave header: must be zero for xrstor */
	movq	%rax, 520(%rsp)
	movq	%rax, 528(%rsp)
	movq	%rax, 536(%rsp)
	movq	%rax, 544(%rsp)
	movq	%rax, 552(%rsp)
	movq	%rax, 560(%rsp)
	movq	%rax, 568(%rsp)
	movl	$0xe7, %eax
	xorl	%edx, %edx
	xsave64	(%rsp)
	jmp	3f
2:	fxsave64 (%rsp)
3:
.endm

.macro VRESTORE
	cmpl	$0, ep_vsave_xsave(%rip)
	je	2f
	movl	$0xe7, %eax
	xorl	%edx, %edx
	xrstor64 (%rsp)
	jmp	3f
2:	fxrstor64 (%rsp)
3:
.endm

	.p2align 6
	.globl	__fentry__
	.type	__fentry__, @function
__fentry__:
	.cfi_startproc
	/* At the probed function's entry rsp = 8 mod 16, so here rsp = 0 mod 16;
	 * after a tail call from odd code anything goes: align explicitly. */
	pushq	%rbp
	.cfi_adjust_cfa_offset 8
	.cfi_offset %rbp, -16
	movq	%rsp, %rbp
	.cfi_def_cfa_register %rbp
	andq	$-16, %rsp
	subq	$64, %rsp		/* 8 GPRs */
	movq	%rax, 0(%rsp)
	movq	%rdi, 8(%rsp)
	movq	%rsi, 16(%rsp)
	movq	%rdx, 24(%rsp)
	movq	%rcx, 32(%rsp)
	movq	%r8, 40(%rsp)
	movq	%r9, 48(%rsp)
	movq	%r10, 56(%rsp)
	movq	8(%rbp), %rdi		/* return address into the probed function */
	leaq	16(%rbp), %rsi		/* its return slot */
	movq	%rsp, %rdx		/* the saved registers (argument capture) */
	call	ep_fentry_enter
	testl	%eax, %eax
	jnz	.Lenter_slow
.Lenter_done:
	movq	0(%rsp), %rax
	movq	8(%rsp), %rdi
	movq	16(%rsp), %rsi
	movq	24(%rsp), %rdx
	movq	32(%rsp), %rcx
	movq	40(%rsp), %r8
	movq	48(%rsp), %r9
	movq	56(%rsp), %r10
	movq	%rbp, %rsp
	popq	%rbp
	.cfi_remember_state
	.cfi_def_cfa %rsp, 8
	.cfi_restore %rbp
	ret
	.cfi_restore_state
.Lenter_slow:
	VSAVE
	movq	8(%rbp), %rdi
	leaq	16(%rbp), %rsi
	movq	%rbp, %rdx		/* the saved registers: (rbp & -16) - 64 */
	andq	$-16, %rdx
	subq	$64, %rdx
	movq	%rsp, %rcx		/* the xsave area (xmm0-7 at 160) */
	call	ep_fentry_enter_slow
	VRESTORE
	movq	%rbp, %rsp		/* back to the save area */
	andq	$-16, %rsp
	subq	$64, %rsp
	jmp	.Lenter_done
	.cfi_endproc
	.size	__fentry__, .-__fentry__

/* The return trampoline: its own cache line, away from any data. */
	.p2align 6
	.hidden	ep_fentry_return
	.globl	ep_fentry_return
	.type	ep_fentry_tramp, @function
ep_fentry_tramp:
	.cfi_startproc
	.cfi_personality 0x1b, ep_fentry_personality	/* DW_EH_PE_pcrel | sdata4 */
	.cfi_def_cfa %rsp, 0
	.cfi_offset %rip, -8
	nop			/* covers return address - 1 */
ep_fentry_return:
	pushq	%rbp
	.cfi_adjust_cfa_offset 8
	.cfi_offset %rbp, -16
	movq	%rsp, %rbp
	.cfi_def_cfa_register %rbp
	pushq	%rbx
	.cfi_offset %rbx, -24
	andq	$-16, %rsp		/* a hijacked frame may have been tail-called from anywhere */
	subq	$64, %rsp
	movq	%rsp, %rbx		/* save area, kept across the C calls */
	movq	%rax, 0(%rbx)
	movq	%rdx, 8(%rbx)
	movaps	%xmm0, 16(%rbx)
	movaps	%xmm1, 32(%rbx)
	leaq	8(%rbp), %rdi		/* rsp at the trampoline: slot + 8 */
	movq	%rbx, %rsi		/* the saved return registers (return-value capture) */
	call	ep_fentry_exit		/* rax = original return address, rdx = need slow path */
	testq	%rdx, %rdx
	jnz	.Lexit_slow
.Lexit_done:
	movq	%rax, %r11
	movq	0(%rbx), %rax
	movq	8(%rbx), %rdx
	movaps	16(%rbx), %xmm0
	movaps	32(%rbx), %xmm1
	movq	-8(%rbp), %rbx
	movq	%rbp, %rsp
	popq	%rbp
	.cfi_remember_state
	.cfi_def_cfa %rsp, 0
	.cfi_restore %rbp
	.cfi_restore %rbx
	jmp	*%r11
	.cfi_restore_state
.Lexit_slow:
	VSAVE
	leaq	8(%rbp), %rdi
	movq	%rbx, %rsi
	call	ep_fentry_exit_slow
	movq	%rax, 48(%rbx)
	VRESTORE
	movq	48(%rbx), %rax
	jmp	.Lexit_done
	.cfi_endproc
	.size	ep_fentry_tramp, .-ep_fentry_tramp

	.section .note.GNU-stack,"",@progbits
