/*
 * Issue 37: fds kept open on /proc/self/task/<tid>/... of the process's own
 * threads: the main thread's (its tid is the pid) and two others', one
 * made before the steps and one halfway through them (after a checkpoint,
 * often).  Each fd must still be the file of its thread: its stat names
 * the thread's tid, its comm the thread's name.
 *
 *   task_fds [steps] [ms-per-step]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include "zdtm.h"

struct task {
	const char *name;
	pid_t tid;
	pthread_t thread;
	int stat_fd, comm_fd;
};

static int quit[2];			/* the threads wait on it */

static void *thread_main(void *arg)
{
	struct task *t = arg;
	char c;

	t->tid = syscall(SYS_gettid);
	prctl(PR_SET_NAME, t->name, 0, 0, 0);
	__atomic_store_n(&t->stat_fd, -2, __ATOMIC_RELEASE);	/* started */
	while (read(quit[0], &c, 1) < 0 && errno == EINTR)
		;
	return NULL;
}

static int open_task_file(pid_t tid, const char *file)
{
	char path[64];
	int fd;

	snprintf(path, sizeof(path), "/proc/self/task/%d/%s", (int)tid, file);
	fd = open(path, O_RDONLY);
	zdtm_check(fd >= 0, "open %s: %m", path);
	return fd;
}

static void open_task_files(struct task *t)
{
	t->stat_fd = open_task_file(t->tid, "stat");
	t->comm_fd = open_task_file(t->tid, "comm");
}

static void start_thread(struct task *t)
{
	t->stat_fd = -1;
	zdtm_check(pthread_create(&t->thread, NULL, thread_main, t) == 0, "pthread_create");
	while (__atomic_load_n(&t->stat_fd, __ATOMIC_ACQUIRE) != -2)
		zdtm_pace(1);
	open_task_files(t);
}

static uint64_t check_task(const struct task *t, uint64_t hash)
{
	char buf[512], want[32];
	ssize_t n;
	long tid;

	n = pread(t->stat_fd, buf, sizeof(buf) - 1, 0);
	zdtm_check(n > 0, "%s: read of its stat: %m", t->name);
	buf[n] = '\0';
	zdtm_check(sscanf(buf, "%ld", &tid) == 1 && tid == t->tid,
		   "%s: its stat names task %ld, not %d", t->name, tid, (int)t->tid);
	n = pread(t->comm_fd, buf, sizeof(buf) - 1, 0);
	zdtm_check(n > 0, "%s: read of its comm: %m", t->name);
	buf[n] = '\0';
	snprintf(want, sizeof(want), "%s\n", t->name);
	zdtm_check(!strcmp(buf, want), "%s: its comm says \"%.*s\"", t->name, (int)n - 1, buf);
	for (const char *p = t->name; *p; p++)
		hash = zdtm_mix(hash, (unsigned char)*p);
	return hash;
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	struct task tasks[] = {
		{ .name = "task-main" }, { .name = "task-early" }, { .name = "task-late" },
	};
	uint64_t hash;

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(pipe(quit) == 0, "pipe: %m");
	tasks[0].tid = getpid();
	prctl(PR_SET_NAME, tasks[0].name, 0, 0, 0);
	open_task_files(&tasks[0]);
	start_thread(&tasks[1]);
	printf("READY\n");
	fflush(stdout);
	hash = zdtm_steps_hash(0, steps / 2, pace);
	start_thread(&tasks[2]);
	hash = zdtm_steps_hash(hash, steps - steps / 2, pace);
	zdtm_hold();
	for (int i = 0; i < 3; i++)
		hash = check_task(&tasks[i], hash);
	close(quit[1]);
	for (int i = 1; i < 3; i++)
		pthread_join(tasks[i].thread, NULL);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
