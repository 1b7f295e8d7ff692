/*
 * Issue 37: /dev/tty shared across fork.  A session leader whose
 * controlling terminal is a pty the job opened opens /dev/tty twice, then
 * forks: parent and child share each open file.  At the end both fds are
 * still /dev/tty in both, still one open file each (kcmp), so the
 * O_NONBLOCK the child set on one before the checkpoint, and on the
 * other after it, shows in the parent; bytes still reach the master.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <linux/kcmp.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include "zdtm.h"

#define PING "ping through a shared /dev/tty\n"
#define WAIT_MS 10000			/* against a hang, not a measure */

static void is_dev_tty(int fd, const char *who)
{
	struct stat st;

	zdtm_check(fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(5, 0),
		   "%s: fd %d is no longer /dev/tty (%u:%u)", who, fd, major(st.st_rdev),
		   minor(st.st_rdev));
}

static void nonblocking(int fd, const char *when)
{
	int fl = fcntl(fd, F_GETFL);

	zdtm_check(fl >= 0 && (fl & O_NONBLOCK), "the leader's /dev/tty fd %d has no O_NONBLOCK "
		   "that its child set %s (%#x)", fd, when, fl);
}

static void same_file(pid_t child, int fd)
{
	zdtm_check(syscall(SYS_kcmp, getpid(), child, KCMP_FILE, fd, fd) == 0,
		   "/dev/tty fd %d is no longer one open file in the leader and its child (%m)",
		   fd);
}

/* The child: sets O_NONBLOCK on t1 now, on t2 when told, after the hold. */
static void grandchild(int t1, int t2, int go, int told)
{
	char byte;

	zdtm_check(fcntl(t1, F_SETFL, fcntl(t1, F_GETFL) | O_NONBLOCK) == 0, "F_SETFL: %m");
	zdtm_hold();
	is_dev_tty(t1, "the child");
	is_dev_tty(t2, "the child");
	zdtm_check(read(go, &byte, 1) == 1, "the leader did not say go");
	zdtm_check(fcntl(t2, F_SETFL, fcntl(t2, F_GETFL) | O_NONBLOCK) == 0, "F_SETFL: %m");
	zdtm_check(write(told, "t", 1) == 1, "write: %m");
	_exit(0);
}

static void leader(const char *slave_name, int ready)
{
	int slave, t1, t2, go[2], told[2], status;
	pid_t child;
	char byte;

	zdtm_check(setsid() == getpid(), "setsid: %m");
	slave = open(slave_name, O_RDWR);	/* a session leader's first: its terminal */
	zdtm_check(slave >= 0, "open %s: %m", slave_name);
	t1 = open("/dev/tty", O_RDWR);
	t2 = open("/dev/tty", O_RDWR);
	zdtm_check(t1 >= 0 && t2 >= 0, "open /dev/tty: %m");
	close(slave);
	zdtm_check(pipe(go) == 0 && pipe(told) == 0, "pipe: %m");
	child = fork();
	zdtm_check(child >= 0, "fork: %m");
	if (child == 0) {
		close(ready);
		close(go[1]);
		close(told[0]);
		grandchild(t1, t2, go[0], told[1]);
	}
	close(go[0]);
	close(told[1]);
	while (!(fcntl(t1, F_GETFL) & O_NONBLOCK))
		zdtm_pace(1);
	zdtm_check(write(ready, "r", 1) == 1, "write: %m");
	close(ready);
	zdtm_hold();
	is_dev_tty(t1, "the leader");
	is_dev_tty(t2, "the leader");
	same_file(child, t1);
	same_file(child, t2);
	nonblocking(t1, "before the checkpoint");
	zdtm_check(write(go[1], "g", 1) == 1, "write: %m");
	zdtm_check(read(told[0], &byte, 1) == 1, "the child did not set its flags");
	nonblocking(t2, "after it");
	zdtm_check(write(t1, PING, strlen(PING)) == (ssize_t)strlen(PING), "write /dev/tty: %m");
	zdtm_check(waitpid(child, &status, 0) == child && WIFEXITED(status) &&
		   WEXITSTATUS(status) == 0, "the child failed (status %#x)", status);
	_exit(0);
}

static void read_until(int fd, const char *want)
{
	char buf[256];
	size_t have = 0;

	buf[0] = '\0';
	while (!strstr(buf, want)) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t n;

		zdtm_check(poll(&p, 1, WAIT_MS) == 1, "\"%s\" did not come (got \"%s\")", want, buf);
		n = read(fd, buf + have, sizeof(buf) - 1 - have);
		zdtm_check(n > 0, "read: %zd: %m", n);
		have += n;
		buf[have] = '\0';
		zdtm_check(have < sizeof(buf) - 1, "\"%s\" did not come (got \"%s\")", want, buf);
	}
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
		leader(ptsname(master), ready[1]);
	}
	close(ready[1]);
	zdtm_check(read(ready[0], &byte, 1) == 1, "the leader did not set its terminal up");
	close(ready[0]);
	printf("READY\n");
	fflush(stdout);
	hash = zdtm_steps_hash(hash, steps, pace);
	zdtm_hold();
	read_until(master, "ping through a shared");
	zdtm_check(waitpid(pid, &status, 0) == pid, "waitpid: %m");
	zdtm_check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the leader failed (status %#x)",
		   status);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
