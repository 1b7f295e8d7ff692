/*
 * File locks a process holds across a checkpoint: a POSIX write lock on
 * bytes 5..14 of one file (fcntl F_SETLK), a shared POSIX lock to its end
 * on another, an exclusive flock() on a third and an OFD read lock
 * (F_OFD_SETLK) on a fourth.  A child checks them from outside at the end
 * (a process never conflicts with its own POSIX locks): each is held, as
 * it was, by the parent; then the parent lets go and the child takes them.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include "zdtm.h"

static struct flock range(short type, off_t start, off_t len)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = start, .l_len = len };

	return fl;
}

static int open_file(const char *name)
{
	int fd = open(name, O_RDWR | O_CREAT, 0600);

	zdtm_check(fd >= 0 && ftruncate(fd, 100) == 0, "open %s", name);
	return fd;
}

/* In the child: what the parent holds, seen from here. */
static void check_held(pid_t parent)
{
	int a = open("posix.lck", O_RDWR), b = open("shared.lck", O_RDWR), c = open("flock.lck", O_RDWR),
	    d = open("ofd.lck", O_RDWR);
	struct flock fl = range(F_WRLCK, 0, 0);

	zdtm_check(fcntl(a, F_GETLK, &fl) == 0 && fl.l_type == F_WRLCK && fl.l_pid == parent &&
		   fl.l_start == 5 && fl.l_len == 10, "POSIX write lock: type %d pid %d %ld+%ld",
		   fl.l_type, fl.l_pid, (long)fl.l_start, (long)fl.l_len);
	fl = range(F_WRLCK, 50, 1);
	zdtm_check(fcntl(b, F_GETLK, &fl) == 0 && fl.l_type == F_RDLCK && fl.l_len == 0,
		   "shared POSIX lock to the end: type %d len %ld", fl.l_type, (long)fl.l_len);
	fl = range(F_RDLCK, 0, 1);
	zdtm_check(fcntl(b, F_SETLK, &fl) == 0, "a shared lock shares");
	zdtm_check(flock(c, LOCK_EX | LOCK_NB) == -1 && errno == EWOULDBLOCK, "flock held");
	fl = range(F_WRLCK, 0, 0);
	zdtm_check(fcntl(d, F_OFD_GETLK, &fl) == 0 && fl.l_type == F_RDLCK && fl.l_pid == -1,
		   "OFD read lock: type %d", fl.l_type);
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	int a, b, c, d, go[2], done[2];
	struct flock fl;
	uint64_t hash = 0;
	char byte;
	pid_t child;

	zdtm_args(argc, argv, &steps, &pace);
	if (argc > 3)
		zdtm_check(chdir(argv[3]) == 0, "chdir");
	a = open_file("posix.lck");
	b = open_file("shared.lck");
	c = open_file("flock.lck");
	d = open_file("ofd.lck");
	fl = range(F_WRLCK, 5, 10);
	zdtm_check(fcntl(a, F_SETLK, &fl) == 0, "F_SETLK");
	fl = range(F_RDLCK, 20, 0);
	zdtm_check(fcntl(b, F_SETLK, &fl) == 0, "F_SETLK shared");
	zdtm_check(flock(c, LOCK_EX) == 0, "flock");
	fl = range(F_RDLCK, 0, 0);
	zdtm_check(fcntl(d, F_OFD_SETLK, &fl) == 0, "F_OFD_SETLK");
	zdtm_check(pipe(go) == 0 && pipe(done) == 0, "pipes");
	child = fork();
	if (child == 0) {
		zdtm_check(read(go[0], &byte, 1) == 1, "child: go");
		check_held(getppid());
		zdtm_check(write(done[1], "x", 1) == 1, "child: done");
		zdtm_check(read(go[0], &byte, 1) == 1, "child: go 2");
		zdtm_check(flock(open("flock.lck", O_RDWR), LOCK_EX | LOCK_NB) == 0, "flock free");
		_exit(0);
	}
	close(go[0]);
	close(done[1]);	/* a child that fails: EOF, not a wait forever */
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	zdtm_hold();
	zdtm_check(write(go[1], "x", 1) == 1 && read(done[0], &byte, 1) == 1, "the child checked");
	zdtm_check(flock(c, LOCK_UN) == 0 && write(go[1], "x", 1) == 1, "unlock");
	{
		int status;

		zdtm_check(waitpid(child, &status, 0) == child && WIFEXITED(status) &&
			   WEXITSTATUS(status) == 0, "the child's checks");
	}
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
