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
 * orig_ax, which signal frames do not carry).  It is known by where the
 * call was made: calls through syscall() keep it in R12 (the shim's own
 * syscall(), timed_calls.c); the `syscall` instructions of glibc's
 * blocking functions are found once, at start-up, each with its
 * function's number; other code is read for a `mov $nr, %eax` right before
 * its `syscall`.  A call that cannot be told keeps its EINTR, with a
 * warning.  (Reading /proc/self/task/T/syscall before signalling each
 * thread would tell more, but it cost 12 us a thread of stopped time.)
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
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <ucontext.h>
#include "shim.h"

#define SYSCALL_INSN_LEN 2
#define MOV_EAX_LEN 5
#define MAX_SITES 256

/* glibc's functions that may block, and the system call each makes. */
static const struct {
	const char *name;
	long nr;
} blocking_functions[] = {
	{ "poll", SYS_poll }, { "ppoll", SYS_ppoll },
	{ "select", SYS_pselect6 }, { "pselect", SYS_pselect6 },
	{ "epoll_wait", SYS_epoll_wait }, { "epoll_pwait", SYS_epoll_pwait },
	{ "epoll_pwait2", SYS_epoll_pwait2 }, { "clock_nanosleep", SYS_clock_nanosleep },
	{ "pause", SYS_pause }, { "sigsuspend", SYS_rt_sigsuspend },
	{ "sigtimedwait", SYS_rt_sigtimedwait }, { "sigwaitinfo", SYS_rt_sigtimedwait },
	{ "msgrcv", SYS_msgrcv }, { "msgsnd", SYS_msgsnd },
	{ "semop", SYS_semop }, { "semtimedop", SYS_semtimedop },
	{ "read", SYS_read }, { "readv", SYS_readv }, { "write", SYS_write },
	{ "writev", SYS_writev }, { "recv", SYS_recvfrom }, { "recvfrom", SYS_recvfrom },
	{ "recvmsg", SYS_recvmsg }, { "recvmmsg", SYS_recvmmsg }, { "send", SYS_sendto },
	{ "sendto", SYS_sendto }, { "sendmsg", SYS_sendmsg }, { "accept", SYS_accept },
	{ "accept4", SYS_accept4 }, { "wait4", SYS_wait4 }, { "waitid", SYS_waitid },
	{ "mq_timedreceive", SYS_mq_timedreceive }, { "mq_timedsend", SYS_mq_timedsend },
	{ "flock", SYS_flock }, { "ioctl", SYS_ioctl },
};

/* The return address of each `syscall` instruction in those functions. */
static struct {
	uint64_t ret;
	long nr;
} sites[MAX_SITES];
static unsigned nsites;

static void find_sites(const char *name, long nr)
{
	const ElfW(Sym) *sym = NULL;
	const unsigned char *code;
	Dl_info info;
	void *fn = dlsym(RTLD_NEXT, name);

	if (!fn || !dladdr1(fn, &info, (void **)&sym, RTLD_DL_SYMENT) || !sym ||
	    !sym->st_size)
		return;
	code = fn;
	for (size_t i = 0; i + 1 < sym->st_size && nsites < MAX_SITES; i++)
		if (code[i] == 0x0f && code[i + 1] == 0x05) {
			sites[nsites].ret = (uint64_t)(code + i + SYSCALL_INSN_LEN);
			sites[nsites].nr = nr;
			nsites++;
		}
}

/* At start-up, in the application's context (dlsym may allocate). */
void syscall_sites_init(void)
{
	for (size_t i = 0; i < sizeof(blocking_functions) / sizeof(blocking_functions[0]); i++)
		find_sites(blocking_functions[i].name, blocking_functions[i].nr);
}

static long site_call(uint64_t ret)
{
	for (unsigned i = 0; i < nsites; i++)
		if (sites[i].ret == ret)
			return sites[i].nr;
	return -1;
}

/* Bytes of our own memory that may not be mapped, without a fault. */
static int read_code(uint64_t addr, void *buf, size_t len)
{
	struct iovec local = { buf, len }, remote = { (void *)addr, len };

	return syscall(SYS_process_vm_readv, getpid(), &local, 1, &remote, 1, 0) ==
	       (long)len ? 0 : -1;
}

/* A context right after the shim's syscall() returned (the arguments are
 * still in their registers: the `syscall` instruction keeps them), whose
 * wrapper has not yet looked at the result: call = number, arguments,
 * result; number 0 otherwise. */
void syscall_just_returned(const void *ucv, long call[8])
{
	const greg_t *g = ((const ucontext_t *)ucv)->uc_mcontext.gregs;

	call[0] = 0;
	if (g[REG_RIP] != (greg_t)shim_raw_syscall_return)
		return;
	call[0] = g[REG_R12];
	call[1] = g[REG_RDI];
	call[2] = g[REG_RSI];
	call[3] = g[REG_RDX];
	call[4] = g[REG_R10];
	call[5] = g[REG_R8];
	call[6] = g[REG_R9];
	call[7] = g[REG_RAX];
}

/* The system call the context returned from with EINTR, or -1. */
static long interrupted_call(const ucontext_t *uc)
{
	const greg_t *g = uc->uc_mcontext.gregs;
	unsigned char code[MOV_EAX_LEN + SYSCALL_INSN_LEN];
	long nr;

	if (g[REG_RAX] != -EINTR || g[REG_RIP] < (greg_t)sizeof(code))
		return -1;
	if (read_code(g[REG_RIP] - sizeof(code), code, sizeof(code)) ||
	    code[MOV_EAX_LEN] != 0x0f || code[MOV_EAX_LEN + 1] != 0x05)	/* syscall */
		return -1;
	if (g[REG_RIP] == (greg_t)shim_raw_syscall_return)
		return g[REG_R12];		/* the shim's syscall() */
	nr = site_call(g[REG_RIP]);
	if (nr >= 0)
		return nr;
	if (code[0] == 0xb8) {			/* mov $imm32, %eax; syscall */
		int32_t imm;

		memcpy(&imm, code + 1, sizeof(imm));
		if (imm >= 0)
			return imm;
	}
	return -2;			/* a call, but which one? */
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

/*
 * An accept() the checkpoint interrupted (to be entered again, by us or,
 * with SA_RESTART, by the kernel: RIP back on its `syscall`) returns a
 * connection the checkpoint took from the listener's backlog, if any
 * (backlog.c): entered again it would take our token.
 */
static int accept_from_backlog(greg_t *g, long nr)
{
	unsigned char code[SYSCALL_INSN_LEN];
	int rewound = 0, fd;

	if (nr != SYS_accept && nr != SYS_accept4) {
		rewound = (g[REG_RAX] == SYS_accept || g[REG_RAX] == SYS_accept4) &&
			  !read_code(g[REG_RIP], code, sizeof(code)) && code[0] == 0x0f &&
			  code[1] == 0x05;
		if (!rewound)
			return 0;
		nr = g[REG_RAX];
	}
	if (!backlog_accept(g[REG_RDI], nr == SYS_accept4 ? g[REG_R10] : 0, &fd))
		return 0;
	if (fd >= 0 && g[REG_RSI])
		net_real_getpeername(fd, (struct sockaddr *)g[REG_RSI], (socklen_t *)g[REG_RDX]);
	g[REG_RAX] = fd >= 0 ? fd : -errno;
	if (rewound)
		g[REG_RIP] += SYSCALL_INSN_LEN;
	return 1;
}

/* Calls that wait for fds to become ready: a plugin may still be putting
 * new files behind some of them (plugins_wait_rebuilt). */
static int waits_for_fds(long nr)
{
	switch (nr) {
	case SYS_poll:
	case SYS_ppoll:
	case SYS_select:
	case SYS_pselect6:
	case SYS_epoll_wait:
	case SYS_epoll_pwait:
	case SYS_epoll_pwait2:
		return 1;
	default:
		return 0;
	}
}

void syscall_restart_resume(void *ucv, int64_t parked_ns, int restored)
{
	ucontext_t *uc = ucv;
	greg_t *g = uc->uc_mcontext.gregs;
	struct timed_call *tc = timed_call_current;
	long nr = interrupted_call(uc);

	if (waits_for_fds(nr) || (tc && waits_for_fds(tc->nr)))
		plugins_wait_rebuilt();
	if (accept_from_backlog(g, nr))
		return;

	/* the time a wrapped call had left goes on from now on a new kernel,
	 * whose monotonic clock has nothing to do with the old one */
	if (restored && tc)
		for (struct timed_call *t = tc; t; t = t->outer)
			t->deadline_ns += shim_now_ns() - parked_ns;
	if (nr == -1 || application_signal_pending(uc))
		return;
	if (nr == -2) {
		shim_log("a checkpoint interrupted an unknown system call of thread %ld: "
			 "it returns EINTR", (long)syscall(SYS_gettid));
		return;
	}
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
