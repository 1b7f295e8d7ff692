/*
 * POSIX timers (timer_create) of every kind the kernel notifies: a
 * periodic one signalling the process with a value, one signalling a
 * given thread (SIGEV_THREAD_ID), one whose expiry glibc's helper thread
 * turns into a call in a new thread (SIGEV_THREAD), a SIGEV_NONE one read by polling, an
 * hour-long one-shot on CLOCK_REALTIME, a disarmed one, and a hole where
 * a deleted timer's id was.  After a restart each id still names its
 * timer (the application holds them), the ticking ones keep ticking at
 * their own thread with their own value, and what is left of the others'
 * time has not grown.
 *
 *   posix_timers [steps] [ms-per-step]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "zdtm.h"

#define TICK_SIGNAL (SIGRTMIN + 2)
#define THREAD_SIGNAL (SIGRTMIN + 3)
#define TICK_VALUE 4242

static volatile long ticks, thread_ticks, calls, wrong_value, wrong_thread;
static volatile pid_t worker_tid;
static volatile int done;

static void on_tick(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	if (si->si_value.sival_int != TICK_VALUE)
		wrong_value++;
	ticks++;
}

static void on_thread_tick(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)si;
	(void)uc;
	if (syscall(SYS_gettid) != worker_tid)
		wrong_thread++;
	thread_ticks++;
}

static void on_call(union sigval v)
{
	if (v.sival_int != TICK_VALUE)
		wrong_value++;
	calls++;
}

static void *worker(void *arg)
{
	sigset_t mine;

	(void)arg;
	sigemptyset(&mine);
	sigaddset(&mine, THREAD_SIGNAL);
	pthread_sigmask(SIG_UNBLOCK, &mine, NULL);
	worker_tid = syscall(SYS_gettid);
	while (!done)
		zdtm_pace(5);
	return NULL;
}

static timer_t make_timer(clockid_t clock, int notify, int sig, int value, pid_t tid)
{
	struct sigevent ev;
	timer_t t;

	memset(&ev, 0, sizeof(ev));
	ev.sigev_notify = notify;
	ev.sigev_signo = sig;
	ev.sigev_value.sival_int = value;
	if (notify == SIGEV_THREAD_ID)
		ev._sigev_un._tid = tid;
	zdtm_check(timer_create(clock, &ev, &t) == 0, "timer_create");
	return t;
}

static void arm(timer_t t, long first_ms, long every_ms)
{
	struct itimerspec its = {
		{ every_ms / 1000, (every_ms % 1000) * 1000000 },
		{ first_ms / 1000, (first_ms % 1000) * 1000000 },
	};

	zdtm_check(timer_settime(t, 0, &its, NULL) == 0, "timer_settime");
}

static long left_ms(timer_t t, long *every_ms)
{
	struct itimerspec its;

	zdtm_check(timer_gettime(t, &its) == 0, "timer_gettime: a timer id no longer names a timer");
	if (every_ms)
		*every_ms = its.it_interval.tv_sec * 1000 + its.it_interval.tv_nsec / 1000000;
	return its.it_value.tv_sec * 1000 + its.it_value.tv_nsec / 1000000;
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10, every, hour_left, last_ticks = 0, last_thread_ticks = 0;
	long last_calls = 0;
	timer_t tick, deleted, thread_timer, polled, hour, idle, caller;
	struct sigevent call;
	struct sigaction sa;
	sigset_t block;
	pthread_t th;

	zdtm_args(argc, argv, &steps, &pace);
	memset(&sa, 0, sizeof(sa));
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sa.sa_sigaction = on_tick;
	zdtm_check(sigaction(TICK_SIGNAL, &sa, NULL) == 0, "sigaction");
	sa.sa_sigaction = on_thread_tick;
	zdtm_check(sigaction(THREAD_SIGNAL, &sa, NULL) == 0, "sigaction");
	signal(SIGUSR1, SIG_IGN);	/* the disarmed timer's, once armed at the end */
	/* only the worker takes the thread timer's signal */
	sigemptyset(&block);
	sigaddset(&block, THREAD_SIGNAL);
	pthread_sigmask(SIG_BLOCK, &block, NULL);
	zdtm_check(pthread_create(&th, NULL, worker, NULL) == 0, "pthread_create");
	while (!worker_tid)
		zdtm_pace(1);

	tick = make_timer(CLOCK_MONOTONIC, SIGEV_SIGNAL, TICK_SIGNAL, TICK_VALUE, 0);
	deleted = make_timer(CLOCK_MONOTONIC, SIGEV_SIGNAL, TICK_SIGNAL, 1, 0);
	thread_timer = make_timer(CLOCK_MONOTONIC, SIGEV_THREAD_ID, THREAD_SIGNAL, 0, worker_tid);
	polled = make_timer(CLOCK_BOOTTIME, SIGEV_NONE, 0, 0, 0);
	hour = make_timer(CLOCK_REALTIME, SIGEV_SIGNAL, SIGALRM, 0, 0);
	idle = make_timer(CLOCK_MONOTONIC, SIGEV_SIGNAL, SIGUSR1, 0, 0);
	zdtm_check(timer_delete(deleted) == 0, "timer_delete");
	memset(&call, 0, sizeof(call));
	call.sigev_notify = SIGEV_THREAD;
	call.sigev_notify_function = on_call;
	call.sigev_value.sival_int = TICK_VALUE;
	zdtm_check(timer_create(CLOCK_MONOTONIC, &call, &caller) == 0, "timer_create SIGEV_THREAD");
	arm(caller, 9, 9);
	arm(tick, 5, 5);
	arm(thread_timer, 7, 7);
	arm(polled, 1000, 1000);
	arm(hour, 3600 * 1000, 0);
	printf("READY\n");
	fflush(stdout);

	for (long s = 1; s <= steps; s++) {
		zdtm_pace(pace);
		if (s % 25)
			continue;
		/* each ticking timer ticked since the last look, at its own thread */
		zdtm_check(ticks > last_ticks, "the periodic timer stopped at step %ld", s);
		zdtm_check(thread_ticks > last_thread_ticks, "the thread's timer stopped at step %ld", s);
		zdtm_check(!wrong_value, "a tick came with another value");
		zdtm_check(!wrong_thread, "a thread tick came to another thread");
		zdtm_check(calls > last_calls, "the SIGEV_THREAD timer stopped at step %ld", s);
		last_calls = calls;
		last_ticks = ticks;
		last_thread_ticks = thread_ticks;
		/* the others: still there, time left not grown */
		zdtm_check(left_ms(polled, &every) <= 1000 && every == 1000, "the polled timer changed");
		hour_left = left_ms(hour, &every);
		zdtm_check(hour_left <= 3600 * 1000 && hour_left > 3000 * 1000 && every == 0,
			   "the hour-long timer has %ld ms left", hour_left);
		zdtm_check(left_ms(idle, &every) == 0 && every == 0, "the disarmed timer runs");
		zdtm_check(timer_gettime(deleted, &(struct itimerspec){ 0 }) != 0,
			   "the deleted timer's id names a timer");
	}
	zdtm_hold();
	/* a restored timer takes new settings */
	arm(idle, 1, 0);
	zdtm_pace(20);
	zdtm_check(left_ms(idle, NULL) == 0, "the disarmed timer did not fire");
	done = 1;
	pthread_join(th, NULL);
	zdtm_pass("posix timers");
	return 0;
}
