/*
 * Signals that stay pending with their siginfo across checkpoints: every
 * thread blocks them, so they wait in the kernel's queues for the whole
 * run and are taken only at the end, where each must carry what it was
 * sent with.
 *   - the process's queue: five sigqueue()s of one real-time signal (values
 *     1..5, in order), a kill() of SIGUSR1 (SI_USER, our pid), and a child's
 *     exit (SIGCHLD: CLD_EXITED, its pid, status 7);
 *   - a worker thread's own queue: three pthread_sigqueue()s of another
 *     real-time signal (101..103) and a pthread_kill() of SIGUSR2 (from our
 *     pid; its code is SI_TKILL or, on newer kernels, SI_USER).
 * At every step both threads check that all are still pending.
 *
 *   pending_siginfo [steps] [ms-per-step]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include "zdtm.h"

#define PROCESS_RT (SIGRTMIN + 3)
#define THREAD_RT (SIGRTMIN + 4)
#define NPROCESS_RT 5
#define NTHREAD_RT 3

static volatile int queued, finished;
static pid_t child;

static int pending(int sig)
{
	sigset_t set;

	return sigpending(&set) == 0 && sigismember(&set, sig) == 1;
}

static void take(int sig, siginfo_t *si, const char *who)
{
	struct timespec now = { 0, 0 };
	sigset_t one;

	sigemptyset(&one);
	sigaddset(&one, sig);
	zdtm_check(sigtimedwait(&one, si, &now) == sig, "%s: signal %d is no longer pending",
		   who, sig);
}

static void take_queued(int sig, int n, int first, const char *who)
{
	for (int i = 0; i < n; i++) {
		siginfo_t si;

		take(sig, &si, who);
		zdtm_check(si.si_code == SI_QUEUE && si.si_pid == getpid() &&
			   si.si_value.sival_int == first + i,
			   "%s: signal %d came back as code %d from %d with value %d, not "
			   "sigqueue()'s from %d with %d", who, sig, si.si_code, si.si_pid,
			   si.si_value.sival_int, getpid(), first + i);
	}
}

static void *worker(void *arg)
{
	siginfo_t si;

	while (!queued)
		zdtm_pace(1);
	while (!finished) {
		zdtm_check(pending(THREAD_RT) && pending(SIGUSR2),
			   "a signal pending for the worker alone was lost");
		zdtm_pace(5);
	}
	take_queued(THREAD_RT, NTHREAD_RT, 101, "worker");
	take(SIGUSR2, &si, "worker");
	zdtm_check((si.si_code == SI_TKILL || si.si_code == SI_USER) && si.si_pid == getpid(),
		   "worker: SIGUSR2 came back as code %d from %d, not pthread_kill()'s",
		   si.si_code, si.si_pid);
	return arg;
}

static void queue_for_the_process(void)
{
	for (int i = 1; i <= NPROCESS_RT; i++)
		zdtm_check(sigqueue(getpid(), PROCESS_RT, (union sigval){ .sival_int = i }) == 0,
			   "sigqueue: %s", strerror(errno));
	zdtm_check(kill(getpid(), SIGUSR1) == 0, "kill: %s", strerror(errno));
	child = fork();
	zdtm_check(child >= 0, "fork: %s", strerror(errno));
	if (child == 0)
		_exit(7);
	while (!pending(SIGCHLD))
		zdtm_pace(1);
}

static void queue_for_the_worker(pthread_t t)
{
	for (int i = 1; i <= NTHREAD_RT; i++)
		zdtm_check(pthread_sigqueue(t, THREAD_RT, (union sigval){ .sival_int = 100 + i }) == 0,
			   "pthread_sigqueue");
	zdtm_check(pthread_kill(t, SIGUSR2) == 0, "pthread_kill");
}

static void take_the_process_queue(void)
{
	siginfo_t si;
	int status;

	take_queued(PROCESS_RT, NPROCESS_RT, 1, "process");
	take(SIGUSR1, &si, "process");
	zdtm_check(si.si_code == SI_USER && si.si_pid == getpid(),
		   "SIGUSR1 came back as code %d from %d, not kill()'s from %d", si.si_code,
		   si.si_pid, getpid());
	take(SIGCHLD, &si, "process");
	zdtm_check(si.si_code == CLD_EXITED && si.si_pid == child && si.si_status == 7,
		   "SIGCHLD came back as code %d from %d status %d, not the exit of %d (7)",
		   si.si_code, si.si_pid, si.si_status, child);
	zdtm_check(waitpid(child, &status, 0) == child && WIFEXITED(status) &&
		   WEXITSTATUS(status) == 7, "the child's exit status was lost");
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	uint64_t hash = 0;
	sigset_t all;
	pthread_t t;

	zdtm_args(argc, argv, &steps, &pace);
	/* blocked in every thread: the worker inherits the mask */
	sigfillset(&all);
	zdtm_check(pthread_sigmask(SIG_BLOCK, &all, NULL) == 0, "block all");
	zdtm_check(pthread_create(&t, NULL, worker, NULL) == 0, "pthread_create");
	queue_for_the_worker(t);
	queue_for_the_process();
	queued = 1;
	printf("READY\n");
	fflush(stdout);
	for (long step = 1; step <= steps; step++) {
		zdtm_check(pending(PROCESS_RT) && pending(SIGUSR1) && pending(SIGCHLD),
			   "a signal pending for the process was lost");
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	zdtm_hold();	/* before finished: the worker takes its queue after a restart too */
	finished = 1;
	pthread_join(t, NULL);
	take_the_process_queue();
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
