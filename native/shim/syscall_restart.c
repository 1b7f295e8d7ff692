/*
 * A checkpoint is invisible to the system call it interrupts.
 *
 * Parking a thread runs a signal handler, and the kernel never restarts
 * poll, select, epoll_wait, sleeps with a relative timeout, System V IPC
 * waits, sigtimedwait, pause or io_getevents after a handler, whatever
 * SA_RESTART says: they return EINTR.  The parking handler undoes that
 * when it returns.  Its signal frame holds the interrupted context: a
 * thread stopped in a system call has RIP just after the `syscall`
 * instruction and RAX = -EINTR.  Rewinding RIP by the instruction's two
 * bytes and putting the call's number back in RAX makes sigreturn enter
 * the same call again with the same arguments, which is what the kernel
 * itself does for the calls it restarts.  The arguments are unchanged
 * (the `syscall` instruction clobbers only RAX, RCX and R11), and the
 * calls whose timeout the kernel updates in place (select, pselect,
 * ppoll) go on with the time they had left.
 *
 * The call's number is gone from the frame (the kernel keeps it in
 * orig_ax, which signal frames do not carry).  The checkpoint thread reads
 * it from /proc/self/task/T/syscall just before it signals the thread; the
 * handler trusts it only if the program counter, stack pointer and the six
 * argument registers are the ones of the frame.  A thread that entered its
 * call after that read is recognised by the `mov $nr, %eax` that glibc's
 * wrappers put right before `syscall`.
 *
 * Calls with a relative timeout that the kernel does not update (poll,
 * epoll_wait, semtimedop, sigtimedwait, nanosleep...) are timed by the
 * shim's wrappers (timed_calls.c): the handler leaves their EINTR in place
 * and tells the wrapper, which calls again with the time left.
 *
 * An application signal that is pending when the handler returns is
 * delivered at once: then the EINTR is the application's and stays.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/uio.h>
#include <ucontext.h>
#include "shim.h"

#define SYSCALL_INSN_LEN 2

void blocked_call_read(pid_t tid, struct blocked_call *call)
{
	char path[64], buf[512], *p, *end;
	ssize_t n;

	memset(call, 0, sizeof(*call));
	snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", tid);
	n = shim_read_proc(path, buf, sizeof(buf) - 1);
	if (n <= 0)
		return;
	buf[n] = '\0';
	/* "nr a0 a1 a2 a3 a4 a5 sp pc", "-1 sp pc" (not in a call) or "running" */
	call->nr = strtol(buf, &end, 10);
	if (end == buf || call->nr < 0)
		return;
	p = end;
	for (int i = 0; i < 6; i++) {
		call->args[i] = strtoull(p, &end, 16);
		if (end == p)
			return;
		p = end;
	}
	call->sp = strtoull(p, &end, 16);
	if (end == p)
		return;
	p = end;
	call->pc = strtoull(p, &end, 16);
	if (end == p)
		return;
	call->known = 1;
}

/* Bytes of our own memory that may not be mapped, without a fault. */
static int read_code(uint64_t addr, void *buf, size_t len)
{
	struct iovec local = { buf, len }, remote = { (void *)addr, len };

	return syscall(SYS_process_vm_readv, getpid(), &local, 1, &remote, 1, 0) ==
	       (long)len ? 0 : -1;
}

/* The system call the context returned from with EINTR, or -1. */
static long interrupted_call(const ucontext_t *uc, const struct blocked_call *call)
{
	const greg_t *g = uc->uc_mcontext.gregs;
	unsigned char code[7];

	if (g[REG_RAX] != -EINTR || g[REG_RIP] < (greg_t)sizeof(code))
		return -1;
	if (read_code(g[REG_RIP] - sizeof(code), code, sizeof(code)) ||
	    code[5] != 0x0f || code[6] != 0x05)	/* syscall */
		return -1;
	if (call->known && call->pc == (uint64_t)g[REG_RIP] &&
	    call->sp == (uint64_t)g[REG_RSP] &&
	    call->args[0] == (uint64_t)g[REG_RDI] && call->args[1] == (uint64_t)g[REG_RSI] &&
	    call->args[2] == (uint64_t)g[REG_RDX] && call->args[3] == (uint64_t)g[REG_R10] &&
	    call->args[4] == (uint64_t)g[REG_R8] && call->args[5] == (uint64_t)g[REG_R9])
		return call->nr;
	if (code[0] == 0xb8) {			/* mov $imm32, %eax */
		int32_t nr;

		memcpy(&nr, code + 1, sizeof(nr));
		return nr >= 0 ? nr : -1;
	}
	return -1;
}

/* Calls that must not simply be entered again: close has released the fd
 * already, connect goes on in the background, restart_syscall's state is
 * dropped by sigreturn, io_uring_enter may have submitted its work. */
static int may_enter_again(long nr)
{
	switch (nr) {
	case SYS_close:
	case SYS_connect:
	case SYS_restart_syscall:
	case SYS_io_uring_enter:
		return 0;
	default:
		return 1;
	}
}

/* A signal of the application's own will be delivered once the handler
 * returns: the call was interrupted for it too. */
static int application_signal_pending(const ucontext_t *uc)
{
	uint64_t pending = 0, blocked;

	memcpy(&blocked, &uc->uc_sigmask, sizeof(blocked));
	if (syscall(SYS_rt_sigpending, &pending, sizeof(pending)))
		return 0;
	pending &= ~blocked;
	pending &= ~(1ULL << (CKPT_SIGNAL - 1));
	return pending != 0;
}

void syscall_restart_resume(void *ucv, const struct blocked_call *call,
			    int64_t parked_ns, int restored)
{
	ucontext_t *uc = ucv;
	greg_t *g = uc->uc_mcontext.gregs;
	struct timed_call *tc = timed_call_current;
	long nr = interrupted_call(uc, call);

	/* the time a wrapped call had left goes on from now on a new kernel,
	 * whose monotonic clock has nothing to do with the old one */
	if (restored && tc)
		for (struct timed_call *t = tc; t; t = t->outer)
			t->deadline_ns += shim_now_ns() - parked_ns;
	if (nr < 0 || application_signal_pending(uc))
		return;
	if (tc && tc->nr == nr) {
		tc->ckpt_interrupted = 1;	/* the wrapper calls again */
		return;
	}
	if (!may_enter_again(nr)) {
		shim_log("a checkpoint interrupted system call %ld of thread %ld: it returns EINTR",
			 nr, (long)syscall(SYS_gettid));
		return;
	}
	g[REG_RIP] -= SYSCALL_INSN_LEN;
	g[REG_RAX] = nr;
}
