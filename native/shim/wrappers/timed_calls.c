/*
 * Blocking calls with a relative timeout that the kernel neither restarts
 * after a signal handler nor updates in place: poll, epoll_wait,
 * epoll_pwait, epoll_pwait2, semtimedop, nanosleep, clock_nanosleep (and
 * the sleep and usleep built on it) and sigtimedwait (signals.c).  When a
 * checkpoint parks a thread blocked in one of them, the parking handler
 * leaves the EINTR and marks the call (syscall_restart.c); the wrapper
 * then calls again with the time the call had left, so the application
 * sees one call that lasts as long as it asked.
 *
 * Cost on the hot path: none but the call through the wrapper.  A call
 * without a timeout (0 or infinite) goes straight to libc.  A timed wait
 * first asks without waiting (timeout 0): when something is ready, as in a
 * busy event loop, that is the answer.  Only a call that is going to
 * block reads CLOCK_MONOTONIC (vDSO) and links a record on the stack, at a
 * cost that waiting hides; `make bench` measures both.  (Reading the clock
 * on every call cost 25 ns, 9% of a poll of a ready pipe, seen here; the
 * coarse clock would be cheaper, but on a tickless kernel it lags by more
 * than its resolution says: seen here 6.6 ms behind with a 4 ms tick.)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <sys/sem.h>
#include <time.h>
#include "shim.h"

__thread struct timed_call *timed_call_current __attribute__((tls_model("initial-exec")));

static const struct timespec no_wait;	/* the first, non-blocking try */

static int64_t ts_ns(const struct timespec *ts)
{
	return (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec;
}

static struct timespec ns_ts(int64_t ns)
{
	struct timespec ts = { ns / 1000000000, ns % 1000000000 };

	return ts;
}

static int ns_ms_up(int64_t ns)
{
	int64_t ms = (ns + 999999) / 1000000;

	return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

void timed_call_begin(struct timed_call *tc, long nr, int64_t timeout_ns)
{
	tc->nr = nr;
	tc->deadline_ns = shim_now_ns() + timeout_ns;
	tc->ckpt_interrupted = 0;
	tc->outer = timed_call_current;
	atomic_signal_fence(memory_order_seq_cst);	/* the handler sees it whole */
	timed_call_current = tc;
}

/* ret: the call's result, -1 with errno for failures.  Whether to call
 * again: only after an EINTR that parking caused. */
int timed_call_again(struct timed_call *tc, int ret)
{
	if (ret != -1 || errno != EINTR || !tc->ckpt_interrupted)
		return 0;
	tc->ckpt_interrupted = 0;
	return 1;
}

void timed_call_end(struct timed_call *tc)
{
	timed_call_current = tc->outer;
}

int64_t timed_call_left_ns(const struct timed_call *tc)
{
	int64_t left = tc->deadline_ns - shim_now_ns();

	return left > 0 ? left : 0;
}

static void *next(const char *name, void **cache)
{
	if (!*cache)
		*cache = dlsym(RTLD_NEXT, name);
	return *cache;
}

typedef int (*poll_fn)(struct pollfd *, nfds_t, int);

SHIM_EXPORT int poll(struct pollfd *fds, nfds_t nfds, int timeout)
{
	static void *real;
	poll_fn call = next("poll", &real);
	struct timed_call tc;
	int r;

	if (timeout <= 0)
		return call(fds, nfds, timeout);
	r = call(fds, nfds, 0);		/* ready: no waiting, no timing */
	if (r != 0)
		return r;
	timed_call_begin(&tc, SYS_poll, (int64_t)timeout * 1000000);
	while (timed_call_again(&tc, r = call(fds, nfds, timeout)))
		timeout = ns_ms_up(timed_call_left_ns(&tc));
	timed_call_end(&tc);
	return r;
}

typedef int (*epoll_wait_fn)(int, struct epoll_event *, int, int);
typedef int (*epoll_pwait_fn)(int, struct epoll_event *, int, int, const sigset_t *);
typedef int (*epoll_pwait2_fn)(int, struct epoll_event *, int, const struct timespec *,
			       const sigset_t *);

SHIM_EXPORT int epoll_wait(int epfd, struct epoll_event *events, int max, int timeout)
{
	static void *real;
	epoll_wait_fn call = next("epoll_wait", &real);
	struct timed_call tc;
	int r;

	if (timeout <= 0)
		return call(epfd, events, max, timeout);
	r = call(epfd, events, max, 0);
	if (r != 0)
		return r;
	timed_call_begin(&tc, SYS_epoll_wait, (int64_t)timeout * 1000000);
	while (timed_call_again(&tc, r = call(epfd, events, max, timeout)))
		timeout = ns_ms_up(timed_call_left_ns(&tc));
	timed_call_end(&tc);
	return r;
}

SHIM_EXPORT int epoll_pwait(int epfd, struct epoll_event *events, int max, int timeout,
			    const sigset_t *mask)
{
	static void *real;
	epoll_pwait_fn call = next("epoll_pwait", &real);
	struct timed_call tc;
	int r;

	if (timeout <= 0)
		return call(epfd, events, max, timeout, mask);
	r = call(epfd, events, max, 0, mask);
	if (r != 0)
		return r;
	timed_call_begin(&tc, SYS_epoll_pwait, (int64_t)timeout * 1000000);
	while (timed_call_again(&tc, r = call(epfd, events, max, timeout, mask)))
		timeout = ns_ms_up(timed_call_left_ns(&tc));
	timed_call_end(&tc);
	return r;
}

SHIM_EXPORT int epoll_pwait2(int epfd, struct epoll_event *events, int max,
			     const struct timespec *timeout, const sigset_t *mask)
{
	static void *real;
	epoll_pwait2_fn call = next("epoll_pwait2", &real);
	struct timed_call tc;
	struct timespec left;
	int r;

	if (!timeout || ts_ns(timeout) <= 0)
		return call(epfd, events, max, timeout, mask);
	r = call(epfd, events, max, &no_wait, mask);
	if (r != 0)
		return r;
	left = *timeout;
	timed_call_begin(&tc, SYS_epoll_pwait2, ts_ns(timeout));
	while (timed_call_again(&tc, r = call(epfd, events, max, &left, mask)))
		left = ns_ts(timed_call_left_ns(&tc));
	timed_call_end(&tc);
	return r;
}

typedef int (*semtimedop_fn)(int, struct sembuf *, size_t, const struct timespec *);

SHIM_EXPORT int semtimedop(int semid, struct sembuf *sops, size_t nsops,
			   const struct timespec *timeout)
{
	static void *real;
	semtimedop_fn call = next("semtimedop", &real);
	struct timed_call tc;
	struct timespec left;
	int r;

	if (!timeout || ts_ns(timeout) <= 0)
		return call(semid, sops, nsops, timeout);
	r = call(semid, sops, nsops, &no_wait);
	if (r != -1 || errno != EAGAIN)
		return r;
	left = *timeout;
	timed_call_begin(&tc, SYS_semtimedop, ts_ns(timeout));
	while (timed_call_again(&tc, r = call(semid, sops, nsops, &left)))
		left = ns_ts(timed_call_left_ns(&tc));
	timed_call_end(&tc);
	return r;
}

/* Sleeps.  glibc's own sleep and usleep reach its clock_nanosleep through
 * internal calls that no wrapper sees: they are wrapped too. */
typedef int (*clock_nanosleep_fn)(clockid_t, int, const struct timespec *, struct timespec *);

static clock_nanosleep_fn real_clock_nanosleep(void)
{
	static void *real;

	return next("clock_nanosleep", &real);
}

/* A relative sleep on clk: 0 or an error number, as clock_nanosleep. */
static int sleep_for(clockid_t clk, const struct timespec *req, struct timespec *rem)
{
	clock_nanosleep_fn call = real_clock_nanosleep();
	struct timed_call tc;
	struct timespec left;
	int err;

	if (!req || req->tv_nsec < 0 || req->tv_nsec >= 1000000000 || req->tv_sec < 0 ||
	    ts_ns(req) == 0 || (clk != CLOCK_REALTIME && clk != CLOCK_MONOTONIC &&
				clk != CLOCK_BOOTTIME && clk != CLOCK_TAI))
		return call(clk, 0, req, rem);
	left = *req;
	timed_call_begin(&tc, SYS_clock_nanosleep, ts_ns(req));
	for (;;) {
		err = call(clk, 0, &left, rem);
		if (err != EINTR || !tc.ckpt_interrupted)
			break;
		tc.ckpt_interrupted = 0;
		left = ns_ts(timed_call_left_ns(&tc));
	}
	timed_call_end(&tc);
	return err;
}

SHIM_EXPORT int clock_nanosleep(clockid_t clk, int flags, const struct timespec *req,
				struct timespec *rem)
{
	if (flags & TIMER_ABSTIME)	/* entered again as it is: same deadline */
		return real_clock_nanosleep()(clk, flags, req, rem);
	return sleep_for(clk, req, rem);
}

SHIM_EXPORT int nanosleep(const struct timespec *req, struct timespec *rem)
{
	int err = sleep_for(CLOCK_REALTIME, req, rem);

	if (err) {
		errno = err;
		return -1;
	}
	return 0;
}

SHIM_EXPORT int usleep(useconds_t usec)
{
	struct timespec ts = { usec / 1000000, (long)(usec % 1000000) * 1000 };

	return nanosleep(&ts, NULL);
}

SHIM_EXPORT unsigned int sleep(unsigned int seconds)
{
	struct timespec ts = { seconds, 0 };

	if (nanosleep(&ts, &ts) == 0)
		return 0;
	return ts.tv_sec + (ts.tv_nsec > 0);
}

/*
 * syscall(): glibc's generic entry puts the number in RAX only, which the
 * kernel overwrites with the result, so a call made through it could not
 * be told after EINTR (its arguments are anybody's).  The shim's own
 * entry keeps the number in R12, which the kernel preserves: the parking
 * handler reads it from the frame when RIP is just after this `syscall`.
 */
long shim_raw_syscall(long nr, long a1, long a2, long a3, long a4, long a5, long a6) SHIM_HIDDEN;
__asm__(".text\n"
	".globl shim_raw_syscall\n"
	".hidden shim_raw_syscall\n"
	".type shim_raw_syscall, @function\n"
	"shim_raw_syscall:\n"
	"\tpushq %r12\n"
	"\tmovq %rdi, %rax\n"
	"\tmovq %rdi, %r12\n"
	"\tmovq %rsi, %rdi\n"
	"\tmovq %rdx, %rsi\n"
	"\tmovq %rcx, %rdx\n"
	"\tmovq %r8, %r10\n"
	"\tmovq %r9, %r8\n"
	"\tmovq 16(%rsp), %r9\n"
	"\tsyscall\n"
	".globl shim_raw_syscall_return\n"
	".hidden shim_raw_syscall_return\n"
	"shim_raw_syscall_return:\n"
	"\tpopq %r12\n"
	"\tret\n"
	".size shim_raw_syscall, .-shim_raw_syscall\n");

SHIM_EXPORT long syscall(long nr, ...)
{
	va_list ap;
	long a[6], r;

	va_start(ap, nr);
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	seccomp_note_call(nr);
	r = shim_raw_syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
	rseq_note_call(nr, a, r);
	aio_note_call(nr, a, r);
	if ((unsigned long)r >= (unsigned long)-4095) {
		errno = -r;
		return -1;
	}
	return r;
}
