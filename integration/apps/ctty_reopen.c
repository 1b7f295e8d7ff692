/*
 * Issue 37, shape 3: /dev/tty opened by a session leader whose
 * controlling terminal is a pty the job opened (as a terminal emulator's
 * shell, or `script`, opens it).  The parent holds the master; a child
 * makes a session of its own, takes the slave as its controlling terminal,
 * closes it and keeps only /dev/tty.  At the end /dev/tty is still
 * /dev/tty, still the child's terminal, and carries bytes both ways
 * between the child and the parent's master.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <termios.h>
#include "zdtm.h"

#define PING "ping from /dev/tty\n"
#define PONG "pong from the master\n"
#define WAIT_MS 10000			/* against a hang, not a measure */

/* Until want is among what fd gave (or its end): the bytes, with what
 * came before them. */
static void read_until(int fd, const char *want, const char *who)
{
	char buf[256];
	size_t have = 0;

	buf[0] = '\0';
	while (!strstr(buf, want)) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t n;

		zdtm_check(poll(&p, 1, WAIT_MS) == 1, "%s: \"%s\" did not come (got \"%s\")", who,
			   want, buf);
		n = read(fd, buf + have, sizeof(buf) - 1 - have);
		zdtm_check(n > 0, "%s: read: %zd: %m", who, n);
		have += n;
		buf[have] = '\0';
		zdtm_check(have < sizeof(buf) - 1, "%s: \"%s\" did not come (got \"%s\")", who,
			   want, buf);
	}
}

static void is_dev_tty(int fd)
{
	struct stat st;

	zdtm_check(fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(5, 0),
		   "the child's fd is no longer /dev/tty (%u:%u)", major(st.st_rdev),
		   minor(st.st_rdev));
}

static void child(const char *slave_name, int ready)
{
	struct termios t;
	int slave, tty;

	zdtm_check(setsid() == getpid(), "setsid: %m");
	slave = open(slave_name, O_RDWR);	/* a session leader's first: its terminal */
	zdtm_check(slave >= 0, "open %s: %m", slave_name);
	zdtm_check(tcgetattr(slave, &t) == 0, "tcgetattr: %m");
	t.c_lflag &= ~ECHO;
	zdtm_check(tcsetattr(slave, TCSANOW, &t) == 0, "tcsetattr: %m");
	tty = open("/dev/tty", O_RDWR | O_CLOEXEC);
	zdtm_check(tty >= 0, "open /dev/tty: %m");
	close(slave);
	zdtm_check(write(ready, "r", 1) == 1, "write: %m");
	close(ready);
	zdtm_hold();
	is_dev_tty(tty);
	zdtm_check(tcgetsid(tty) == getpid(), "/dev/tty is not the session's terminal: %m");
	zdtm_check(write(tty, PING, strlen(PING)) == (ssize_t)strlen(PING), "write /dev/tty: %m");
	read_until(tty, PONG, "the child, on /dev/tty");
	_exit(0);
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	uint64_t hash = 0;
	int master, ready[2], status;
	char byte;
	pid_t pid;

	zdtm_args(argc, argv, &steps, &pace);
	master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
	zdtm_check(master >= 0 && grantpt(master) == 0 && unlockpt(master) == 0, "a pty: %m");
	zdtm_check(pipe(ready) == 0, "pipe: %m");
	pid = fork();
	zdtm_check(pid >= 0, "fork: %m");
	if (pid == 0) {
		close(ready[0]);
		child(ptsname(master), ready[1]);
	}
	close(ready[1]);
	zdtm_check(read(ready[0], &byte, 1) == 1, "the child did not set its terminal up");
	close(ready[0]);
	printf("READY\n");
	fflush(stdout);
	hash = zdtm_steps_hash(hash, steps, pace);
	zdtm_hold();
	read_until(master, "ping from /dev/tty", "the parent, on the master");
	zdtm_check(write(master, PONG, strlen(PONG)) == (ssize_t)strlen(PONG), "write master: %m");
	zdtm_check(waitpid(pid, &status, 0) == pid, "waitpid: %m");
	zdtm_check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (status %#x)",
		   status);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
