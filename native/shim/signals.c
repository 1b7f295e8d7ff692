/*
 * The reserved signal CKPT_SIGNAL parks threads.  The application must not
 * take it over or block it, so sigaction, signal, sigprocmask and
 * pthread_sigmask are interposed: its disposition cannot be changed and it
 * is removed from every mask the application sets.  Only these rare calls
 * pay for the interposition.
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

static void resolve_real(void)
{
	if (!real_sigaction)
		real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
	if (!real_sigprocmask)
		real_sigprocmask = (sigprocmask_fn)dlsym(RTLD_NEXT, "sigprocmask");
	if (!real_pthread_sigmask)
		real_pthread_sigmask = (pthread_sigmask_fn)dlsym(RTLD_NEXT, "pthread_sigmask");
}

int signals_init(void (*handler)(int, siginfo_t *, void *))
{
	struct sigaction sa;

	resolve_real();
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = handler;
	/* SA_RESTART: a parked thread's interrupted syscall restarts */
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigfillset(&sa.sa_mask);
	sigdelset(&sa.sa_mask, SIGSEGV);
	sigdelset(&sa.sa_mask, SIGBUS);
	if (real_sigaction(CKPT_SIGNAL, &sa, NULL))
		return errno;
	reserved_active = 1;
	return 0;
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
	if (reserved_active && sig == CKPT_SIGNAL && act) {
		errno = EINVAL;
		return -1;
	}
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

SHIM_EXPORT int sigtimedwait(const sigset_t *set, siginfo_t *info, const struct timespec *timeout)
{
	static void *real;
	sigset_t copy;

	return ((sigtimedwait_fn)next_symbol("sigtimedwait", &real))(
		without_reserved(SIG_SETMASK, set, &copy), info, timeout);
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
