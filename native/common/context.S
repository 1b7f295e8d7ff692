/*
 * Save and resume the callee-saved state of a thread (x86-64 SysV).
 * Like setjmp/longjmp, but without glibc's pointer mangling: the context is
 * saved by the shim and resumed by ckpt-restart, two programs with two
 * different pointer guards.
 *
 * int  ckpt_save_context(struct ckpt_regs *r);          returns 0
 * void ckpt_resume_context(const struct ckpt_regs *r, long ret);
 *      continues at the save point, where ckpt_save_context returns ret.
 */
	.text
	.globl	ckpt_save_context
	.hidden	ckpt_save_context
	.type	ckpt_save_context, @function
ckpt_save_context:
	movq	%rbx, 0(%rdi)
	movq	%rbp, 8(%rdi)
	movq	%r12, 16(%rdi)
	movq	%r13, 24(%rdi)
	movq	%r14, 32(%rdi)
	movq	%r15, 40(%rdi)
	leaq	8(%rsp), %rax		/* the caller's rsp after our ret */
	movq	%rax, 48(%rdi)
	movq	(%rsp), %rax		/* our return address */
	movq	%rax, 56(%rdi)
	xorl	%eax, %eax
	ret
	.size	ckpt_save_context, .-ckpt_save_context

	.globl	ckpt_resume_context
	.hidden	ckpt_resume_context
	.type	ckpt_resume_context, @function
ckpt_resume_context:
	movq	0(%rdi), %rbx
	movq	8(%rdi), %rbp
	movq	16(%rdi), %r12
	movq	24(%rdi), %r13
	movq	32(%rdi), %r14
	movq	40(%rdi), %r15
	movq	48(%rdi), %rsp
	movq	%rsi, %rax
	jmp	*56(%rdi)
	.size	ckpt_resume_context, .-ckpt_resume_context

	.section .note.GNU-stack,"",@progbits
