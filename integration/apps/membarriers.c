/*
 * Userspace RCU, JIT runtimes and garbage collectors register for private
 * expedited membarrier() once and issue barriers ever after; a command the
 * process did not register for fails with EPERM.  With a worker thread
 * running, both barrier kinds must keep working after a restart.
 *
 *   membarriers [steps] [ms-per-step]
 */
#define _GNU_SOURCE
#include <linux/membarrier.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include "zdtm.h"

static volatile int done;
static volatile uint64_t ticks;

static long membarrier(int cmd)
{
	return syscall(SYS_membarrier, cmd, 0, 0);
}

static void *worker(void *arg)
{
	(void)arg;
	while (!done) {
		ticks++;
		zdtm_pace(1);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	long offered = membarrier(MEMBARRIER_CMD_QUERY);
	int sync_core = offered > 0 && (offered & MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE);
	pthread_t th;

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(offered > 0 && (offered & MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED),
		   "no private expedited membarrier here");
	zdtm_check(membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) < 0 && errno == EPERM,
		   "a barrier before registering did not fail with EPERM");
	zdtm_check(membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0, "register: %s",
		   strerror(errno));
	if (sync_core)
		zdtm_check(membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE) == 0,
			   "register sync-core: %s", strerror(errno));
	zdtm_check(pthread_create(&th, NULL, worker, NULL) == 0, "pthread_create");
	while (!ticks)
		zdtm_pace(1);
	printf("READY\n");
	fflush(stdout);
	for (long s = 1; s <= steps; s++) {
		zdtm_check(membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0,
			   "step %ld: private expedited barrier: %s", s, strerror(errno));
		if (sync_core)
			zdtm_check(membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE) == 0,
				   "step %ld: sync-core barrier: %s", s, strerror(errno));
		zdtm_pace(pace);
	}
	zdtm_hold();
	zdtm_check(membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0,
		   "after the hold: private expedited barrier: %s", strerror(errno));
	done = 1;
	pthread_join(th, NULL);
	zdtm_pass("barriers kept working (sync-core %s)", sync_core ? "too" : "not offered");
	return 0;
}
