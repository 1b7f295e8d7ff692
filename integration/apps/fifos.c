/*
 * A parent and its child over two named pipes (FIFOs) in the given
 * directory: the parent keeps AHEAD tokens queued in the one going down,
 * the child answers each with a mix of it through the one going up, so
 * bytes sit in both FIFOs at every checkpoint.  At the end the parent
 * checks every answer and the child's exit status.
 *
 *   fifos [steps] [ms-per-step] [dir]
 */
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include "zdtm.h"

#define AHEAD 8

static void xfer(int fd, uint64_t *v, int writing, const char *what)
{
	ssize_t n = writing ? write(fd, v, sizeof(*v)) : read(fd, v, sizeof(*v));

	zdtm_check(n == sizeof(*v), "%s: %zd", what, n);
}

static void child(const char *down_path, const char *up_path, long pace)
{
	int down = open(down_path, O_RDONLY), up = open(up_path, O_WRONLY);
	uint64_t token;

	zdtm_check(down >= 0 && up >= 0, "child: open fifos");
	while (read(down, &token, sizeof(token)) == sizeof(token)) {
		token = zdtm_mix(token, 0xf1f0);
		xfer(up, &token, 1, "child answer");
		zdtm_pace(pace / 2);
	}
	_exit(0);
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	const char *dir = argc > 3 ? argv[3] : ".";
	char down_path[512], up_path[512];
	uint64_t token = 1, answer, hash = 0;
	long sent = 0;
	int down, up, status;
	pid_t pid;

	zdtm_args(argc, argv, &steps, &pace);
	snprintf(down_path, sizeof(down_path), "%s/fifo-down-%d", dir, getpid());
	snprintf(up_path, sizeof(up_path), "%s/fifo-up-%d", dir, getpid());
	zdtm_check(mkfifo(down_path, 0600) == 0 && mkfifo(up_path, 0600) == 0, "mkfifo");
	pid = fork();
	zdtm_check(pid >= 0, "fork");
	if (pid == 0)
		child(down_path, up_path, pace);
	down = open(down_path, O_WRONLY);
	up = open(up_path, O_RDONLY);
	zdtm_check(down >= 0 && up >= 0, "parent: open fifos");
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		while (sent < steps && sent < step + AHEAD) {	/* keep tokens queued */
			token = zdtm_mix(token, sent++);
			xfer(down, &token, 1, "parent send");
		}
		xfer(up, &answer, 0, "parent receive");
		hash = zdtm_mix(hash, answer);
		zdtm_pace(pace);
	}
	zdtm_hold();
	close(down);
	zdtm_check(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && !WEXITSTATUS(status),
		   "child status %#x", status);
	unlink(down_path);
	unlink(up_path);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
