/*
 * Issue 37, shape 4: two separate opens of one file, same flags and same
 * offset, both inherited across fork.  Each is one open file description
 * shared by parent and child: the child sees the parent's lseek on the
 * first, and its second stays where it was when the parent moves the
 * first (its own description).  And a pipe end opened again through
 * /proc/self/fd in the parent, inherited by the child: one description in
 * both, not the original end's (its O_NONBLOCK is not the original's).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "zdtm.h"

static int go[2], result[2];

static void child(int a, int b, int wreopened)
{
	char verdict = 'P';

	/* the parent moved a to 100 and b stays at 0; the reopened pipe end
	 * is blocking here and in the parent, whatever the original's flags */
	if (read(go[0], &verdict, 1) != 1)
		verdict = 'r';
	else if (lseek(a, 0, SEEK_CUR) != 100)
		verdict = 'a';
	else if (lseek(b, 0, SEEK_CUR) != 0)
		verdict = 'b';
	else if (fcntl(wreopened, F_GETFL) & O_NONBLOCK)
		verdict = 'n';
	else
		verdict = 'P';
	if (write(result[1], &verdict, 1) != 1)
		_exit(2);
	_exit(0);
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	char path[] = "file_reopen_fork.XXXXXX", verdict = 0, link[64];
	uint64_t hash = 0;
	int fd, a, b, p[2], wreopened, status;
	pid_t pid;

	zdtm_args(argc, argv, &steps, &pace);
	fd = mkstemp(path);
	zdtm_check(fd >= 0 && ftruncate(fd, 4096) == 0, "a file");
	close(fd);
	a = open(path, O_RDWR);
	b = open(path, O_RDWR);
	zdtm_check(a >= 0 && b >= 0 && pipe(p) == 0 && pipe(go) == 0 && pipe(result) == 0,
		   "two opens and pipes");
	snprintf(link, sizeof(link), "/proc/self/fd/%d", p[1]);
	wreopened = open(link, O_WRONLY);
	zdtm_check(wreopened >= 0 && fcntl(p[1], F_SETFL, O_NONBLOCK) == 0, "a reopened pipe end");
	pid = fork();
	zdtm_check(pid >= 0, "fork");
	if (pid == 0)
		child(a, b, wreopened);
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	zdtm_hold();
	zdtm_check(lseek(a, 100, SEEK_SET) == 100, "lseek");
	zdtm_check(write(go[1], "g", 1) == 1 && read(result[0], &verdict, 1) == 1, "the child's verdict");
	zdtm_check(verdict != 'a', "the child's first open no longer follows the parent's lseek");
	zdtm_check(verdict != 'b', "the child's second open moved with the first");
	zdtm_check(verdict != 'n', "the reopened pipe end took the original end's O_NONBLOCK");
	zdtm_check(verdict == 'P', "the child failed (%c)", verdict);
	zdtm_check(!(fcntl(wreopened, F_GETFL) & O_NONBLOCK) && (fcntl(p[1], F_GETFL) & O_NONBLOCK),
		   "the pipe ends' flags in the parent");
	zdtm_check(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && !WEXITSTATUS(status),
		   "the child's exit");
	unlink(path);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
