/*
 * Every real-time signal is the application's: a handler for each of
 * SIGRTMIN..SIGRTMAX, each queued with values in every step (in order,
 * none lost), a full mask that reads back whole, and a few of them taken
 * through sigwaitinfo and a signalfd instead of a handler.  A second
 * thread makes glibc broadcast set*id calls with its own internal signal
 * (SIGSETXID, which the checkpoint shares): they must go on working.  It
 * blocks every signal, and two sent to it alone (pthread_kill) stay
 * pending for it until the end, when it takes them.
 *
 *   rtsignals [steps] [ms-per-step]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/signalfd.h>
#include "zdtm.h"

#define NRT (SIGRTMAX - SIGRTMIN + 1)

static volatile long got[64];
static volatile long last_value[64];
static volatile int order_broken;
static volatile int finished;

static int pending_for_me(void)
{
	sigset_t pending;

	return sigpending(&pending) == 0 && sigismember(&pending, SIGUSR1) == 1 &&
	       sigismember(&pending, SIGUSR2) == 1;
}

static void *bystander(void *arg)
{
	struct timespec now = { 0, 0 };
	sigset_t mine;
	int taken = 0;

	/* born with every signal blocked: the process's are the main thread's */
	while (!pending_for_me())
		zdtm_pace(1);
	while (!finished) {
		zdtm_check(pending_for_me(), "a signal pending for one thread was lost");
		zdtm_pace(5);
	}
	sigemptyset(&mine);
	sigaddset(&mine, SIGUSR1);
	sigaddset(&mine, SIGUSR2);
	while (sigtimedwait(&mine, NULL, &now) > 0)
		taken++;
	zdtm_check(taken == 2, "%d signals pending for the thread, not 2", taken);
	return arg;
}

static void on_rt(int sig, siginfo_t *si, void *uc)
{
	int i = sig - SIGRTMIN;

	(void)uc;
	/* queued real-time signals arrive in the order they were sent */
	if (si->si_value.sival_int != last_value[i] + 1 || si->si_code != SI_QUEUE ||
	    si->si_pid != getpid())
		order_broken = sig;
	last_value[i] = si->si_value.sival_int;
	got[i]++;
}

static void check_full_mask(void)
{
	sigset_t full, now, old;

	sigfillset(&full);
	zdtm_check(sigprocmask(SIG_SETMASK, &full, &old) == 0, "block all");
	zdtm_check(sigprocmask(SIG_SETMASK, NULL, &now) == 0, "read mask");
	for (int sig = 1; sig < NSIG; sig++)
		zdtm_check(sig == SIGKILL || sig == SIGSTOP ||
			   sigismember(&full, sig) == sigismember(&now, sig),
			   "signal %d: blocked %d, asked %d", sig, sigismember(&now, sig),
			   sigismember(&full, sig));
	zdtm_check(sigprocmask(SIG_SETMASK, &old, NULL) == 0, "restore mask");
}

/* SIGRTMAX-1 by sigwaitinfo, SIGRTMAX by a signalfd: both blocked. */
static void take_waited(int sfd, long step)
{
	union sigval v = { .sival_int = (int)step };
	struct signalfd_siginfo fdsi;
	siginfo_t si;
	sigset_t one;

	sigemptyset(&one);
	sigaddset(&one, SIGRTMAX - 1);
	zdtm_check(sigqueue(getpid(), SIGRTMAX - 1, v) == 0, "sigqueue");
	zdtm_check(sigwaitinfo(&one, &si) == SIGRTMAX - 1 && si.si_value.sival_int == step,
		   "sigwaitinfo step %ld", step);
	zdtm_check(sigqueue(getpid(), SIGRTMAX, v) == 0, "sigqueue");
	zdtm_check(read(sfd, &fdsi, sizeof(fdsi)) == sizeof(fdsi) &&
		   (int)fdsi.ssi_signo == SIGRTMAX && fdsi.ssi_int == step,
		   "signalfd step %ld", step);
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	struct sigaction sa;
	sigset_t waited;
	uint64_t hash = 0;
	pthread_t other;
	int sfd;

	zdtm_args(argc, argv, &steps, &pace);
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_rt;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	for (int sig = SIGRTMIN; sig <= SIGRTMAX; sig++)
		zdtm_check(sigaction(sig, &sa, NULL) == 0, "sigaction(%d): %s", sig,
			   strerror(errno));
	sigemptyset(&waited);
	sigaddset(&waited, SIGRTMAX - 1);
	sigaddset(&waited, SIGRTMAX);
	zdtm_check(sigprocmask(SIG_BLOCK, &waited, NULL) == 0, "block waited");
	sfd = signalfd(-1, &waited, 0);
	zdtm_check(sfd >= 0, "signalfd");
	{	/* born with every signal blocked, so none goes to it */
		sigset_t all, mine;

		sigfillset(&all);
		pthread_sigmask(SIG_BLOCK, &all, &mine);
		zdtm_check(pthread_create(&other, NULL, bystander, NULL) == 0, "pthread_create");
		pthread_sigmask(SIG_SETMASK, &mine, NULL);
	}
	zdtm_check(pthread_kill(other, SIGUSR1) == 0 && pthread_kill(other, SIGUSR2) == 0,
		   "pthread_kill");
	sigdelset(&waited, SIGRTMAX - 1);
	check_full_mask();
	printf("READY\n");
	fflush(stdout);
	for (long step = 1; step <= steps; step++) {
		union sigval v = { .sival_int = (int)step };

		/* blocked while queued, so that all are delivered together */
		sigset_t all, old;

		sigfillset(&all);
		sigprocmask(SIG_BLOCK, &all, &old);
		for (int sig = SIGRTMIN; sig <= SIGRTMAX - 2; sig++)
			zdtm_check(sigqueue(getpid(), sig, v) == 0, "sigqueue(%d)", sig);
		sigprocmask(SIG_SETMASK, &old, NULL);
		for (int sig = SIGRTMIN; sig <= SIGRTMAX - 2; sig++)
			zdtm_check(got[sig - SIGRTMIN] == step, "signal %d: %ld of %ld", sig,
				   got[sig - SIGRTMIN], step);
		zdtm_check(!order_broken, "signal %d out of order", order_broken);
		take_waited(sfd, step);
		if (step % 50 == 0)
			check_full_mask();
		/* glibc signals every thread for it (SIGSETXID) */
		if (step % 20 == 0)
			zdtm_check(setgid(getgid()) == 0, "setgid: %s", strerror(errno));
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	/* before the thread takes the two signals pending for it */
	zdtm_hold();
	finished = 1;
	pthread_join(other, NULL);
	for (int sig = SIGRTMIN; sig <= SIGRTMAX; sig++) {
		struct sigaction now;

		zdtm_check(sigaction(sig, NULL, &now) == 0 && now.sa_sigaction == on_rt,
			   "handler of %d lost", sig);
	}
	zdtm_pass("%016llx signals=%d", (unsigned long long)hash, NRT);
	return 0;
}
