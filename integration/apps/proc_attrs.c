/*
 * Scheduling and process attributes a program sets for itself: each
 * thread's name (its comm, as ps and pthread_getname_np show it), nice
 * value, policy (SCHED_BATCH, SCHED_IDLE), CPU affinity and parent-death
 * signal, and the process's child-subreaper, no_new_privs,
 * THP-disable and dumpable flags.  All are checked at every step, from
 * each thread itself, and must be as they were after a restart.
 *
 *   proc_attrs [steps] [ms-per-step]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "zdtm.h"

struct attrs {
	const char *name;		/* NULL: the program's own */
	int nice, policy, pdeath, cpu;	/* cpu: the one it is pinned to, or -1 */
};

static volatile int done;

static void set_attrs(const struct attrs *a)
{
	struct sched_param sp = { 0 };
	cpu_set_t cpus;

	if (a->name)
		zdtm_check(prctl(PR_SET_NAME, a->name) == 0, "PR_SET_NAME");
	zdtm_check(sched_setscheduler(0, a->policy, &sp) == 0, "sched_setscheduler");
	zdtm_check(setpriority(PRIO_PROCESS, syscall(SYS_gettid), a->nice) == 0, "setpriority");
	zdtm_check(prctl(PR_SET_PDEATHSIG, a->pdeath) == 0, "PR_SET_PDEATHSIG");
	if (a->cpu >= 0) {
		CPU_ZERO(&cpus);
		CPU_SET(a->cpu, &cpus);
		zdtm_check(sched_setaffinity(0, sizeof(cpus), &cpus) == 0, "sched_setaffinity");
	}
}

static void check_attrs(const struct attrs *a, const char *who)
{
	char name[16] = "";
	cpu_set_t cpus;
	int sig = -1;

	zdtm_check(prctl(PR_GET_NAME, name) == 0 && !strcmp(name, a->name ? a->name : "proc_attrs"),
		   "%s: its name changed to '%s'", who, name);
	errno = 0;
	zdtm_check(getpriority(PRIO_PROCESS, syscall(SYS_gettid)) == a->nice && !errno,
		   "%s: nice changed", who);
	zdtm_check(sched_getscheduler(0) == a->policy, "%s: policy changed", who);
	zdtm_check(prctl(PR_GET_PDEATHSIG, &sig) == 0 && sig == a->pdeath,
		   "%s: parent-death signal changed", who);
	if (a->cpu >= 0)
		zdtm_check(sched_getaffinity(0, sizeof(cpus), &cpus) == 0 && CPU_COUNT(&cpus) == 1 &&
			   CPU_ISSET(a->cpu, &cpus), "%s: CPU affinity changed", who);
}

static void *worker(void *arg)
{
	const struct attrs *a = arg;

	set_attrs(a);
	while (!done) {
		check_attrs(a, "worker");
		zdtm_pace(5);
	}
	check_attrs(a, "worker");	/* once more, whenever SCHED_IDLE let it run */
	return NULL;
}

static void check_process(void)
{
	int subreaper = 0;

	zdtm_check(prctl(PR_GET_CHILD_SUBREAPER, &subreaper) == 0 && subreaper == 1,
		   "no longer a child subreaper");
	zdtm_check(prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1, "no_new_privs lost");
	zdtm_check(prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1, "THP disable lost");
	zdtm_check(prctl(PR_GET_DUMPABLE) == 1, "dumpable changed");
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	int two_cpus = sysconf(_SC_NPROCESSORS_ONLN) > 1;
	struct attrs main_attrs = { NULL, 7, SCHED_BATCH, SIGUSR2, two_cpus ? 1 : 0 };
	struct attrs worker_attrs = { "attrs worker", 4, SCHED_IDLE, 0, 0 };
	pthread_t th;

	zdtm_args(argc, argv, &steps, &pace);
	signal(SIGUSR2, SIG_IGN);
	zdtm_check(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0, "PR_SET_CHILD_SUBREAPER");
	zdtm_check(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0, "PR_SET_NO_NEW_PRIVS");
	zdtm_check(prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0, "PR_SET_THP_DISABLE");
	set_attrs(&main_attrs);
	zdtm_check(pthread_create(&th, NULL, worker, &worker_attrs) == 0, "pthread_create");
	printf("READY\n");
	fflush(stdout);
	for (long s = 1; s <= steps; s++) {
		check_attrs(&main_attrs, "main thread");
		check_process();
		zdtm_pace(pace);
	}
	zdtm_hold();	/* before done: the worker checks its attributes once more */
	done = 1;
	pthread_join(th, NULL);
	zdtm_pass("attributes kept");
	return 0;
}
