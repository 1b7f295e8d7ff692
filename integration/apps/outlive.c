/*
 * The job's first process ends at once and leaves two processes behind: a
 * daemon (fork, setsid, fork) and an orphan of its process group.  They
 * talk over a pipe pair: the orphan sends numbered steps, the daemon
 * hashes them and answers, and the orphan checks every answer and writes
 * the result.  The job lives on in them: it is checkpointed and restarted
 * with them.
 *
 *   outlive [steps] [ms-per-step]
 */
#define _GNU_SOURCE
#include <string.h>
#include <sys/wait.h>
#include "zdtm.h"

static long steps = 300, pace = 10;

static void daemon_side(int in, int out)
{
	uint64_t h = 7, v;

	for (long s = 0; s <= steps; s++) {	/* one more after the orphan's hold */
		zdtm_check(read(in, &v, sizeof(v)) == sizeof(v), "daemon read");
		zdtm_check(v == (uint64_t)s, "daemon: step %lld, expected %ld", (long long)v, s);
		h = zdtm_mix(h, v);
		zdtm_check(write(out, &h, sizeof(h)) == sizeof(h), "daemon write");
	}
}

/* Step s to the daemon; its answer must be the hash so far. */
static uint64_t exchange(int in, int out, long s, uint64_t h)
{
	uint64_t v = s, got;

	zdtm_check(write(out, &v, sizeof(v)) == sizeof(v), "orphan write");
	zdtm_check(read(in, &got, sizeof(got)) == sizeof(got), "orphan read");
	h = zdtm_mix(h, v);
	zdtm_check(got == h, "orphan: answer %ld wrong", s);
	return h;
}

static void orphan_side(int in, int out)
{
	uint64_t h = 7;

	for (long s = 0; s < steps; s++) {
		h = exchange(in, out, s, h);
		zdtm_pace(pace);
	}
	zdtm_hold();
	h = exchange(in, out, steps, h);	/* the daemon still answers */
	zdtm_pass("%016llx", (unsigned long long)h);
}

/* fork, [setsid,] fork: the middle process ends at once */
static pid_t start(int new_session)
{
	pid_t middle = fork();

	zdtm_check(middle >= 0, "fork");
	if (middle > 0) {
		zdtm_check(waitpid(middle, NULL, 0) == middle, "waitpid");
		return middle;
	}
	if (new_session)
		setsid();
	if (fork() != 0)
		_exit(0);
	while (getppid() == middle)	/* adopted once the middle ends */
		zdtm_pace(1);
	return 0;
}

int main(int argc, char **argv)
{
	int down[2], up[2];

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(pipe(down) == 0 && pipe(up) == 0, "pipe");
	printf("READY\n");
	fflush(stdout);
	if (start(1) == 0) {
		close(down[1]);
		close(up[0]);
		daemon_side(down[0], up[1]);
		_exit(0);
	}
	if (start(0) == 0) {
		close(down[0]);
		close(up[1]);
		orphan_side(up[0], down[1]);
		_exit(0);
	}
	return 3;	/* the launcher reports this status */
}
