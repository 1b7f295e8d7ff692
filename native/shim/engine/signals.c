/*
 * The parking signal CKPT_SIGNAL is glibc's SIGSETXID (33), one of the two
 * signals glibc keeps for itself: its sigaction refuses them, sigfillset,
 * sigprocmask and pthread_sigmask leave them out, so the application keeps
 * every signal it can name, real-time ones included.  glibc installs its
 * own handler for SIGSETXID when the process creates its first thread
 * (for set*id calls, which it broadcasts to every thread); the checkpoint
 * thread takes the signal back before it signals threads
 * (signals_reclaim) and the parking handler passes glibc's signals on to
 * glibc's handler (signals_chain).
 *
 * Masks the application builds by hand may still name the signal: the
 * interposed mask and wait functions take it out, so that it is never
 * blocked.  Only these rare calls pay for the interposition.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/signalfd.h>
#include <time.h>
#include "shim.h"

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
typedef int (*sigprocmask_fn)(int, const sigset_t *, sigset_t *);
typedef int (*pthread_sigmask_fn)(int, const sigset_t *, sigset_t *);

static sigaction_fn real_sigaction;
static sigprocmask_fn real_sigprocmask;
static pthread_sigmask_fn real_pthread_sigmask;
static int reserved_active;

#ifndef SA_RESTORER
#define SA_RESTORER 0x04000000
#endif

/* The kernel's struct sigaction (x86-64). */
struct kernel_sigaction {
	void *handler;
	unsigned long flags;
	void (*restorer)(void);
	uint64_t mask;
};

/* glibc's sigaction refuses signal 33, so the shim installs it with the
 * system call and a sigreturn trampoline of its own, the same bytes as
 * glibc's __restore_rt (which debuggers recognise). */
extern void shim_restore_rt(void) SHIM_HIDDEN;
__asm__(".text\n"
	".hidden shim_restore_rt\n"
	".type shim_restore_rt, @function\n"
	"shim_restore_rt:\n"
	"\tmovq $15, %rax\n"
	"\tsyscall\n"
	".size shim_restore_rt, .-shim_restore_rt\n");

static void (*parking_handler)(int, siginfo_t *, void *);
static struct kernel_sigaction chained;	/* glibc's, once it installed one */

static void resolve_real(void)
{
	if (!real_sigaction)
		real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
	if (!real_sigprocmask)
		real_sigprocmask = (sigprocmask_fn)dlsym(RTLD_NEXT, "sigprocmask");
	if (!real_pthread_sigmask)
		real_pthread_sigmask = (pthread_sigmask_fn)dlsym(RTLD_NEXT, "pthread_sigmask");
}

static int install_parking_handler(void)
{
	struct kernel_sigaction sa = {
		.handler = (void *)parking_handler,
		/* SA_RESTART: the calls the kernel restarts are restarted */
		.flags = SA_SIGINFO | SA_RESTART | SA_RESTORER,
		.restorer = shim_restore_rt,
		.mask = ~0ULL,
	};

	sa.mask &= ~(1ULL << (SIGSEGV - 1));
	sa.mask &= ~(1ULL << (SIGBUS - 1));
	if (syscall(SYS_rt_sigaction, CKPT_SIGNAL, &sa, NULL, sizeof(sa.mask)))
		return errno;
	return 0;
}

int signals_init(void (*handler)(int, siginfo_t *, void *))
{
	int err;

	resolve_real();
	parking_handler = handler;
	err = install_parking_handler();
	if (!err)
		reserved_active = 1;
	return err;
}

/* glibc may have put its own handler in place since the last look. */
int signals_reclaim(void)
{
	struct kernel_sigaction cur;

	if (syscall(SYS_rt_sigaction, CKPT_SIGNAL, NULL, &cur, sizeof(cur.mask)))
		return errno;
	if (cur.handler == (void *)parking_handler)
		return 0;
	chained = cur;
	return install_parking_handler();
}

/* A CKPT_SIGNAL that is not the checkpoint's: glibc's, for its handler. */
int signals_chain(int sig, siginfo_t *si, void *uc)
{
	struct kernel_sigaction h = chained;

	if (h.handler == (void *)SIG_DFL || h.handler == (void *)SIG_IGN)
		return 0;
	if (h.flags & SA_SIGINFO)
		((void (*)(int, siginfo_t *, void *))h.handler)(sig, si, uc);
	else
		((void (*)(int))h.handler)(sig);
	return 1;
}

static const sigset_t *without_reserved(int how, const sigset_t *set, sigset_t *copy)
{
	if (!reserved_active || !set || how == SIG_UNBLOCK)
		return set;
	*copy = *set;
	sigdelset(copy, CKPT_SIGNAL);
	return copy;
}

SHIM_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
	struct sigaction copy;

	resolve_real();
	if (reserved_active && act) {	/* a handler must not block it either */
		copy = *act;
		sigdelset(&copy.sa_mask, CKPT_SIGNAL);
		act = &copy;
	}
	return real_sigaction(sig, act, old);
}

SHIM_EXPORT sighandler_t signal(int sig, sighandler_t handler)
{
	struct sigaction sa, old;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = handler;
	sa.sa_flags = SA_RESTART;	/* BSD semantics, as glibc's signal() */
	if (sigaction(sig, &sa, &old))
		return SIG_ERR;
	return old.sa_handler;
}

SHIM_EXPORT int sigprocmask(int how, const sigset_t *set, sigset_t *old)
{
	sigset_t copy;

	resolve_real();
	return real_sigprocmask(how, without_reserved(how, set, &copy), old);
}

SHIM_EXPORT int pthread_sigmask(int how, const sigset_t *set, sigset_t *old)
{
	sigset_t copy;

	resolve_real();
	return real_pthread_sigmask(how, without_reserved(how, set, &copy), old);
}

/* Waiting for signals: the reserved one must neither be taken by the
 * application nor blocked while it waits. */
typedef int (*sigsuspend_fn)(const sigset_t *);
typedef int (*sigwaitinfo_fn)(const sigset_t *, siginfo_t *);
typedef int (*sigtimedwait_fn)(const sigset_t *, siginfo_t *, const struct timespec *);
typedef int (*sigwait_fn)(const sigset_t *, int *);
typedef int (*signalfd_fn)(int, const sigset_t *, int);

static void *next_symbol(const char *name, void **cache)
{
	if (!*cache)
		*cache = dlsym(RTLD_NEXT, name);
	return *cache;
}

SHIM_EXPORT int sigsuspend(const sigset_t *mask)
{
	static void *real;
	sigset_t copy;

	return ((sigsuspend_fn)next_symbol("sigsuspend", &real))(
		without_reserved(SIG_SETMASK, mask, &copy));
}

SHIM_EXPORT int sigwaitinfo(const sigset_t *set, siginfo_t *info)
{
	static void *real;
	sigset_t copy;

	return ((sigwaitinfo_fn)next_symbol("sigwaitinfo", &real))(
		without_reserved(SIG_SETMASK, set, &copy), info);
}

/* Also a wait with a relative timeout the kernel does not update
 * (timed_calls.c): a checkpoint does not cut it short. */
SHIM_EXPORT int sigtimedwait(const sigset_t *set, siginfo_t *info, const struct timespec *timeout)
{
	static void *real;
	sigtimedwait_fn call = next_symbol("sigtimedwait", &real);
	struct timed_call tc;
	struct timespec left;
	sigset_t copy;
	int r;

	set = without_reserved(SIG_SETMASK, set, &copy);
	if (!timeout || (timeout->tv_sec <= 0 && timeout->tv_nsec <= 0))
		return call(set, info, timeout);
	left = *timeout;
	timed_call_begin(&tc, SYS_rt_sigtimedwait,
			 (int64_t)timeout->tv_sec * 1000000000 + timeout->tv_nsec);
	while (timed_call_again(&tc, r = call(set, info, &left))) {
		int64_t ns = timed_call_left_ns(&tc);

		left.tv_sec = ns / 1000000000;
		left.tv_nsec = ns % 1000000000;
	}
	timed_call_end(&tc);
	return r;
}

SHIM_EXPORT int sigwait(const sigset_t *set, int *sig)
{
	static void *real;
	sigset_t copy;

	return ((sigwait_fn)next_symbol("sigwait", &real))(
		without_reserved(SIG_SETMASK, set, &copy), sig);
}

SHIM_EXPORT int signalfd(int fd, const sigset_t *mask, int flags)
{
	static void *real;
	sigset_t copy;

	return ((signalfd_fn)next_symbol("signalfd", &real))(
		fd, without_reserved(SIG_SETMASK, mask, &copy), flags);
}
