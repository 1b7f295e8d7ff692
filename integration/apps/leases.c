/*
 * File leases (fcntl F_SETLEASE), as file servers hold them: a read lease
 * on one file whose break is announced by SIGRTMIN+1 (F_SETSIG), a write
 * lease on another with the default SIGIO.  Each step checks F_GETLEASE
 * and F_GETSIG; at the end a child opens the first file for writing, which
 * breaks the read lease: the parent must get its signal for that fd, give
 * the lease up, and the child's open then goes through.
 *
 *   leases [steps] [ms-per-step] [dir]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include "zdtm.h"

static volatile sig_atomic_t broken_fd = -1;

static void on_break(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	broken_fd = si->si_fd;
}

static int open_file(const char *name, int flags)
{
	int fd;

	close(open(name, O_WRONLY | O_CREAT, 0600));
	fd = open(name, flags);
	zdtm_check(fd >= 0, "open %s: %s", name, strerror(errno));
	return fd;
}

static void check_leases(int rd, int wr, long step)
{
	zdtm_check(fcntl(rd, F_GETLEASE) == F_RDLCK, "step %ld: the read lease is gone", step);
	zdtm_check(fcntl(rd, F_GETSIG) == SIGRTMIN + 1, "step %ld: the read lease's signal changed",
		   step);
	zdtm_check(fcntl(wr, F_GETLEASE) == F_WRLCK, "step %ld: the write lease is gone", step);
	zdtm_check(fcntl(wr, F_GETSIG) == 0, "step %ld: the write lease's signal changed", step);
}

/* A writer breaks the read lease: we hear of it, let go, and it opens. */
static void break_read_lease(int rd)
{
	struct timespec nap = { 0, 1000000 };
	int status, waited = 0;
	pid_t child = fork();

	zdtm_check(child >= 0, "fork");
	if (child == 0)
		_exit(open("read.lease", O_WRONLY) >= 0 ? 0 : 1);
	while (broken_fd < 0 && waited++ < 10000)
		nanosleep(&nap, NULL);
	zdtm_check(broken_fd == rd, "no lease-break signal for fd %d (got %d)", rd, (int)broken_fd);
	zdtm_check(fcntl(rd, F_SETLEASE, F_UNLCK) == 0, "giving the lease up: %s", strerror(errno));
	zdtm_check(waitpid(child, &status, 0) == child && WIFEXITED(status) &&
		   WEXITSTATUS(status) == 0, "the writer's open failed");
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	struct sigaction sa = { .sa_sigaction = on_break, .sa_flags = SA_SIGINFO | SA_RESTART };
	int rd, wr;

	zdtm_args(argc, argv, &steps, &pace);
	if (argc > 3)
		zdtm_check(chdir(argv[3]) == 0, "chdir");
	sigemptyset(&sa.sa_mask);
	zdtm_check(sigaction(SIGRTMIN + 1, &sa, NULL) == 0, "sigaction");
	rd = open_file("read.lease", O_RDONLY);
	wr = open_file("write.lease", O_RDONLY);
	zdtm_check(fcntl(rd, F_SETSIG, SIGRTMIN + 1) == 0, "F_SETSIG");
	zdtm_check(fcntl(rd, F_SETLEASE, F_RDLCK) == 0, "read lease: %s", strerror(errno));
	zdtm_check(fcntl(wr, F_SETLEASE, F_WRLCK) == 0, "write lease: %s", strerror(errno));
	printf("READY\n");
	fflush(stdout);
	for (long s = 1; s <= steps; s++) {
		check_leases(rd, wr, s);
		zdtm_pace(pace);
	}
	zdtm_hold();
	break_read_lease(rd);
	zdtm_pass("leases kept");
	return 0;
}
