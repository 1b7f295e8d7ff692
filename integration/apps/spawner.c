/*
 * Children made without fork(): one by posix_spawn() with an environment
 * that has no LD_PRELOAD or CKPT_* (glibc execs it internally), one by
 * clone() with its own memory (no fork handlers run).  Each does paced
 * work and sends its result up a pipe; the parent checks both results and
 * both exit statuses.  Both children must be in every checkpoint.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <spawn.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include "zdtm.h"

#define STACK_SIZE (256 * 1024)

static long steps = 300, pace = 10;
static int result_fd;

static uint64_t work(uint64_t seed)
{
	return zdtm_steps_hash(seed, steps, pace);
}

static int send_result(uint64_t seed)
{
	uint64_t hash = work(seed);

	return write(result_fd, &hash, sizeof(hash)) == sizeof(hash) ? (int)(hash & 0x7f) : 100;
}

/* returns: glibc's clone then ends the child with exit() */
static int cloned_child(void *arg)
{
	(void)arg;
	return send_result(2);
}

static uint64_t expected(uint64_t seed)
{
	return zdtm_steps_hash(seed, steps, 0);
}

static void check_child(pid_t pid, const char *how)
{
	int status = 0;

	zdtm_check(waitpid(pid, &status, 0) == pid, "waitpid(%s child %d)", how, (int)pid);
	zdtm_check(WIFEXITED(status) && WEXITSTATUS(status) != 100, "%s child: status %#x",
		   how, status);
}

int main(int argc, char **argv)
{
	char *const scrubbed_env[] = { "PATH=/usr/bin:/bin", NULL };
	char steps_arg[32], pace_arg[32];
	uint64_t got[2] = { 0, 0 }, mine;
	posix_spawn_file_actions_t actions;
	pid_t spawned, cloned;
	char *stack;
	int fds[2];

	if (argc == 4 && !strcmp(argv[1], "--spawned")) {
		steps = atol(argv[2]);
		pace = atol(argv[3]);
		result_fd = 3;
		return send_result(1);
	}
	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(pipe(fds) == 0, "pipe");
	result_fd = fds[1];
	snprintf(steps_arg, sizeof(steps_arg), "%ld", steps);
	snprintf(pace_arg, sizeof(pace_arg), "%ld", pace);
	posix_spawn_file_actions_init(&actions);
	posix_spawn_file_actions_adddup2(&actions, fds[1], 3);
	zdtm_check(posix_spawn(&spawned, "/proc/self/exe", &actions, NULL,
			       (char *[]){ argv[0], "--spawned", steps_arg, pace_arg, NULL },
			       scrubbed_env) == 0, "posix_spawn");
	stack = mmap(NULL, STACK_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	zdtm_check(stack != MAP_FAILED, "mmap");
	cloned = clone(cloned_child, stack + STACK_SIZE, SIGCHLD, NULL);
	zdtm_check(cloned > 0, "clone");
	printf("READY\n");
	fflush(stdout);
	mine = work(0);
	/* before the results: the children finish and exit (zombies) meanwhile */
	zdtm_hold();
	for (int i = 0; i < 2; i++) {
		uint64_t v;

		zdtm_check(read(fds[0], &v, sizeof(v)) == sizeof(v), "read result %d", i);
		got[v == expected(2)] = v;
	}
	zdtm_check(got[0] == expected(1), "spawned child sent %llx", (unsigned long long)got[0]);
	zdtm_check(got[1] == expected(2), "cloned child sent %llx", (unsigned long long)got[1]);
	check_child(spawned, "spawned");
	check_child(cloned, "cloned");
	zdtm_pass("%016llx", (unsigned long long)(mine ^ got[0] ^ got[1]));
	return 0;
}
