/*
 * Issue 37: a file of a thread of another process of the job.  The parent
 * opens /proc/self/task/<tid>/stat of one of its threads and forks: the
 * child shares that open file (one offset), and opens the thread's comm
 * itself (/proc/<parent>/task/<tid>/comm, an open file of its own).  After
 * a restart both still name the parent's thread, and the parent's lseek
 * on the shared one moves the child's offset too.
 *
 *   task_fds_fork [steps] [ms-per-step]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include "zdtm.h"

#define NAME "task-shared"

static int quit[2], to_child[2], from_child[2];
static volatile pid_t thread_tid;

static void *thread_main(void *arg)
{
	char c;

	(void)arg;
	prctl(PR_SET_NAME, NAME, 0, 0, 0);
	__atomic_store_n(&thread_tid, syscall(SYS_gettid), __ATOMIC_RELEASE);
	while (read(quit[0], &c, 1) < 0 && errno == EINTR)
		;
	return NULL;
}

/* What fd shows of the thread: 's' stat not the thread's, 'c' comm not
 * its name, 0 if right. */
static char names_thread(int stat_fd, int comm_fd, pid_t tid)
{
	char buf[512];
	ssize_t n = pread(stat_fd, buf, sizeof(buf) - 1, 0);
	long got;

	if (n <= 0)
		return 's';
	buf[n] = '\0';
	if (sscanf(buf, "%ld", &got) != 1 || got != tid)
		return 's';
	n = pread(comm_fd, buf, sizeof(buf) - 1, 0);
	if (n <= 0 || (size_t)n != strlen(NAME) + 1 || memcmp(buf, NAME "\n", n))
		return 'c';
	return 0;
}

/* On 'g': is the shared stat at offset 5 (the parent moved it), and do
 * both files name the thread?  Answers 'k' or what is wrong. */
static void child(int stat_fd, pid_t tid)
{
	char path[64], cmd, answer;
	int comm_fd;

	close(to_child[1]);
	close(from_child[0]);
	snprintf(path, sizeof(path), "/proc/%d/task/%d/comm", (int)getppid(), (int)tid);
	comm_fd = open(path, O_RDONLY);
	answer = comm_fd < 0 ? 'o' : 'k';
	if (write(from_child[1], &answer, 1) != 1)	/* opened */
		_exit(2);
	while (read(to_child[0], &cmd, 1) == 1 && cmd == 'g') {
		answer = lseek(stat_fd, 0, SEEK_CUR) != 5 ? 'l' : names_thread(stat_fd, comm_fd, tid);
		if (!answer)
			answer = 'k';
		if (write(from_child[1], &answer, 1) != 1)
			_exit(2);
	}
	_exit(0);
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	char path[64], cmd = 'g', answer = 0, what;
	pthread_t thread;
	uint64_t hash = 0;
	int stat_fd, comm_fd, status;
	pid_t pid, tid;

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(pipe(quit) == 0 && pipe(to_child) == 0 && pipe(from_child) == 0, "pipes: %m");
	zdtm_check(pthread_create(&thread, NULL, thread_main, NULL) == 0, "pthread_create");
	while (!(tid = __atomic_load_n(&thread_tid, __ATOMIC_ACQUIRE)))
		zdtm_pace(1);
	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
	stat_fd = open(path, O_RDONLY);
	snprintf(path, sizeof(path), "/proc/self/task/%d/comm", (int)tid);
	comm_fd = open(path, O_RDONLY);
	zdtm_check(stat_fd >= 0 && comm_fd >= 0, "open the thread's files: %m");
	pid = fork();
	zdtm_check(pid >= 0, "fork: %m");
	if (pid == 0)
		child(stat_fd, tid);
	close(to_child[0]);
	close(from_child[1]);
	zdtm_check(read(from_child[0], &answer, 1) == 1 && answer == 'k',
		   "the child cannot open the thread's comm (%c)", answer);
	printf("READY\n");
	fflush(stdout);
	hash = zdtm_steps_hash(hash, steps, pace);
	zdtm_hold();
	what = names_thread(stat_fd, comm_fd, tid);
	zdtm_check(!what, "the parent's fds do not name its thread %d (%c)", (int)tid, what);
	zdtm_check(lseek(stat_fd, 5, SEEK_SET) == 5, "lseek: %m");
	zdtm_check(write(to_child[1], &cmd, 1) == 1 && read(from_child[0], &answer, 1) == 1,
		   "the child does not answer");
	zdtm_check(answer == 'k', "the child's files of the parent's thread: %s",
		   answer == 'l' ? "the stat it shares no longer follows the parent's lseek" :
		   answer == 's' ? "its stat does not name the thread" :
		   answer == 'c' ? "its comm does not name the thread" : "unknown");
	close(to_child[1]);
	zdtm_check(waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
		   WEXITSTATUS(status) == 0, "the child ended badly");
	close(quit[1]);
	pthread_join(thread, NULL);
	for (const char *p = NAME; *p; p++)
		hash = zdtm_mix(hash, (unsigned char)*p);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
