/*
 * rseq areas the program registers itself, with glibc's own turned off (it
 * runs itself again with GLIBC_TUNABLES=glibc.pthread.rseq=0), as runtimes
 * with their own per-CPU code do: the main thread and a worker each
 * register a 32-byte area with a signature of their own.  At every step
 * each thread checks that its area is still the one the kernel knows
 * (registering it again says EBUSY, not success, EINVAL or EPERM) and
 * that the kernel still writes it (its cpu_id, spoiled, is a CPU again
 * after a signal was delivered).
 *
 *   rseq_own [steps] [ms-per-step]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/rseq.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "zdtm.h"

#define OWN_SIG 0x0badc0de
#define SPOILED 0xfffffff0u

static __thread struct rseq area __attribute__((aligned(32)));
static volatile int done;
static long ncpu;

static void on_signal(int sig)
{
	(void)sig;
}

static void register_area(void)
{
	zdtm_check(syscall(SYS_rseq, &area, 32, 0, OWN_SIG) == 0, "rseq registration: %s",
		   strerror(errno));
}

static void check_area(const char *who)
{
	long r = syscall(SYS_rseq, &area, 32, 0, OWN_SIG);

	zdtm_check(r == -1 && errno == EBUSY, "%s: its rseq area is no longer registered (%s)",
		   who, r == 0 ? "registering it again worked" : strerror(errno));
	area.cpu_id = SPOILED;
	zdtm_check(pthread_kill(pthread_self(), SIGUSR1) == 0, "pthread_kill");
	zdtm_check(area.cpu_id < (unsigned)ncpu, "%s: the kernel no longer writes its rseq area "
		   "(cpu_id %#x)", who, area.cpu_id);
}

static void *worker(void *arg)
{
	register_area();
	while (!done) {
		check_area("worker");
		zdtm_pace(5);
	}
	return arg;
}

static void without_glibc_rseq(char **argv)
{
	const char *tunables = getenv("GLIBC_TUNABLES");

	if (!__rseq_size)
		return;
	zdtm_check(!tunables || !strstr(tunables, "glibc.pthread.rseq=0"),
		   "glibc registered rseq though told not to");
	setenv("GLIBC_TUNABLES", "glibc.pthread.rseq=0", 1);
	execv("/proc/self/exe", argv);
	zdtm_check(0, "execv: %s", strerror(errno));
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	pthread_t th;

	without_glibc_rseq(argv);
	zdtm_args(argc, argv, &steps, &pace);
	ncpu = sysconf(_SC_NPROCESSORS_CONF);
	signal(SIGUSR1, on_signal);
	register_area();
	zdtm_check(pthread_create(&th, NULL, worker, NULL) == 0, "pthread_create");
	printf("READY\n");
	fflush(stdout);
	for (long s = 1; s <= steps; s++) {
		check_area("main thread");
		zdtm_pace(pace);
	}
	/* the worker goes on checking its area meanwhile */
	zdtm_hold();
	done = 1;
	pthread_join(th, NULL);
	zdtm_pass("own rseq areas kept");
	return 0;
}
