/*
 * Forks all the time: each step a child computes the step's value, sends
 * it up a pipe and exits with its low byte; the parent reads it, waits for
 * the child and checks both.  Checkpoints at random moments then land while
 * a child is being forked and has not yet told the coordinator it exists:
 * the checkpoint must take it in (or it would be missing at restart, and
 * the parent's waitpid() would fail).
 */
#include <sys/wait.h>
#include "zdtm.h"

static uint64_t step_value(long step)
{
	return zdtm_mix(0x5eed, step);
}

static void child(int fd, long step, long pace)
{
	uint64_t v = step_value(step);

	zdtm_pace(pace);
	if (write(fd, &v, sizeof(v)) != sizeof(v))
		_exit(100);
	_exit((int)(v & 0x7f));
}

/* One child: forked, its value read from the pipe, its status waited for. */
static uint64_t fork_step(const int fds[2], long step, long pace)
{
	uint64_t v = 0;
	int status = 0;
	pid_t pid = fork();

	zdtm_check(pid >= 0, "fork at step %ld", step);
	if (pid == 0)
		child(fds[1], step, pace);
	zdtm_check(read(fds[0], &v, sizeof(v)) == sizeof(v), "read at step %ld", step);
	zdtm_check(v == step_value(step), "step %ld: child sent %llx", step,
		   (unsigned long long)v);
	zdtm_check(waitpid(pid, &status, 0) == pid, "waitpid(%d) at step %ld", (int)pid, step);
	zdtm_check(WIFEXITED(status) && WEXITSTATUS(status) == (int)(v & 0x7f),
		   "step %ld: child's status %#x", step, status);
	return v;
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	uint64_t hash = 0;
	int fds[2];

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(pipe(fds) == 0, "pipe");
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++)
		hash = zdtm_mix(hash, fork_step(fds, step, pace));
	zdtm_hold();
	hash = zdtm_mix(hash, fork_step(fds, steps, 0));	/* forking still works */
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
