/*
 * Issue 37: an fd on /proc/self/task/<tid>/stat of a thread that has
 * exited since (joined): reading it says ESRCH.  A checkpoint refuses it
 * in one line (no restart could give the file of a task that is gone
 * back); the program runs on and checks its fd.
 *
 *   task_fds_exited [steps] [ms-per-step]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include "zdtm.h"

static int stat_fd = -1;

static void *thread_main(void *arg)
{
	char path[64];

	(void)arg;
	snprintf(path, sizeof(path), "/proc/self/task/%ld/stat", (long)syscall(SYS_gettid));
	stat_fd = open(path, O_RDONLY);
	return NULL;
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	pthread_t thread;
	char buf[256];
	uint64_t hash;

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(pthread_create(&thread, NULL, thread_main, NULL) == 0, "pthread_create");
	pthread_join(thread, NULL);
	zdtm_check(stat_fd >= 0, "open of the thread's stat: %m");
	printf("READY\n");
	fflush(stdout);
	hash = zdtm_steps_hash(0, steps, pace);
	zdtm_hold();
	errno = 0;
	zdtm_check(pread(stat_fd, buf, sizeof(buf), 0) < 0 && errno == ESRCH,
		   "the stat of an exited thread reads (errno %d), not ESRCH", errno);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
