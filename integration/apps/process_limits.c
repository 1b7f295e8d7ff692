/*
 * Limits and modes a program sets for itself that no file or map shows:
 * its umask, resource limits (a core limit of 0/0, as `ulimit -c 0` sets
 * it; a lowered file limit; a CPU-time limit), memory-deny-write-execute
 * (PR_SET_MDWE, where the kernel has it), and each thread's own
 * personality (ADDR_NO_RANDOMIZE), I/O priority (ioprio_set: best-effort
 * level 6 in one thread, the idle class in another) and timer slack.
 * Checked at every step, from each thread itself, and must be as they
 * were after a restart.
 *
 *   process_limits [steps] [ms-per-step]
 */
#define _GNU_SOURCE
#include <linux/ioprio.h>
#include <pthread.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "zdtm.h"

#ifndef PR_SET_MDWE
#define PR_SET_MDWE 65		/* Linux 6.3; Debian 12's headers are 6.1's */
#define PR_GET_MDWE 66
#endif

struct thread_modes {
	unsigned long personality;
	int ioprio;
	long timer_slack_ns;
};

static const struct thread_modes main_modes = {
	PER_LINUX | ADDR_NO_RANDOMIZE, IOPRIO_PRIO_VALUE(IOPRIO_CLASS_BE, 6), 123456
};
static const struct thread_modes other_modes = {
	PER_LINUX, IOPRIO_PRIO_VALUE(IOPRIO_CLASS_IDLE, 0), 7000
};
static int mdwe;	/* 1 once set; 0 where the kernel has no MDWE */

static const struct {
	int resource;
	struct rlimit limit;
	const char *name;
} limits[] = {
	{ RLIMIT_CORE, { 0, 0 }, "core" },
	{ RLIMIT_NOFILE, { 200, 300 }, "open files" },
	{ RLIMIT_CPU, { 3600, 7200 }, "CPU time" },
};

static volatile int done;

static void set_modes(const struct thread_modes *m)
{
	zdtm_check(personality(m->personality) != -1, "personality");
	zdtm_check(syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, m->ioprio) == 0, "ioprio_set");
	zdtm_check(prctl(PR_SET_TIMERSLACK, m->timer_slack_ns) == 0, "PR_SET_TIMERSLACK");
}

static void check_modes(const struct thread_modes *m, const char *who)
{
	long got = syscall(SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0);

	zdtm_check((unsigned long)personality(0xffffffff) == m->personality,
		   "%s: personality is %#x, was %#lx", who, personality(0xffffffff), m->personality);
	zdtm_check(got == m->ioprio, "%s: I/O priority is %#lx, was %#x", who, got, m->ioprio);
	got = prctl(PR_GET_TIMERSLACK);
	zdtm_check(got == m->timer_slack_ns, "%s: timer slack is %ld ns, was %ld", who, got,
		   m->timer_slack_ns);
}

static void check_process(void)
{
	mode_t mask = umask(0);

	umask(mask);
	zdtm_check(mask == 027, "umask is %03o, was 027", (unsigned)mask);
	zdtm_check(!mdwe || prctl(PR_GET_MDWE, 0, 0, 0, 0) == 1,
		   "memory-deny-write-execute is %d, was 1", prctl(PR_GET_MDWE, 0, 0, 0, 0));
	for (unsigned i = 0; i < sizeof(limits) / sizeof(limits[0]); i++) {
		struct rlimit got;

		zdtm_check(getrlimit(limits[i].resource, &got) == 0 &&
			   got.rlim_cur == limits[i].limit.rlim_cur &&
			   got.rlim_max == limits[i].limit.rlim_max,
			   "%s limit is %lld/%lld, was %lld/%lld", limits[i].name,
			   (long long)got.rlim_cur, (long long)got.rlim_max,
			   (long long)limits[i].limit.rlim_cur, (long long)limits[i].limit.rlim_max);
	}
}

static void *other_thread(void *arg)
{
	(void)arg;
	set_modes(&other_modes);
	while (!done) {
		check_modes(&other_modes, "the other thread");
		zdtm_pace(5);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	uint64_t hash = 0;
	pthread_t other;

	zdtm_args(argc, argv, &steps, &pace);
	umask(027);
	for (unsigned i = 0; i < sizeof(limits) / sizeof(limits[0]); i++)
		zdtm_check(setrlimit(limits[i].resource, &limits[i].limit) == 0, "setrlimit %s",
			   limits[i].name);
	mdwe = prctl(PR_SET_MDWE, 1, 0, 0, 0) == 0;	/* PR_MDWE_REFUSE_EXEC_GAIN */
	set_modes(&main_modes);
	zdtm_check(pthread_create(&other, NULL, other_thread, NULL) == 0, "pthread_create");
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		check_process();
		check_modes(&main_modes, "the main thread");
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	zdtm_hold();
	check_process();
	check_modes(&main_modes, "the main thread");
	done = 1;
	pthread_join(other, NULL);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
