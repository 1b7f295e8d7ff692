/*
 * pidfds (pidfd_open): of the process itself, of a child that lives on
 * (one blocking, one O_NONBLOCK), and of a child that exited and was
 * reaped before the checkpoints.  After a restart each still refers to
 * its process: the living ones are not readable, the exited one is and
 * cannot be signalled; at the end the child is killed through its pidfd
 * and waited for through the other one.
 *
 *   pidfds [steps] [ms-per-step]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "zdtm.h"

#ifndef PIDFD_NONBLOCK
#define PIDFD_NONBLOCK O_NONBLOCK
#endif

static int pidfd_open(pid_t pid, unsigned flags)
{
	return syscall(SYS_pidfd_open, pid, flags);
}

static int readable(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	zdtm_check(poll(&p, 1, 0) >= 0, "poll");
	return (p.revents & POLLIN) != 0;
}

static pid_t child_that(int lives)
{
	pid_t pid = fork();

	zdtm_check(pid >= 0, "fork");
	if (pid == 0) {
		while (lives)
			pause();
		_exit(3);
	}
	return pid;
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	pid_t living, gone;
	int self, child, child_nb, exited;
	siginfo_t si;

	zdtm_args(argc, argv, &steps, &pace);
	living = child_that(1);
	gone = child_that(0);
	self = pidfd_open(getpid(), 0);
	child = pidfd_open(living, 0);
	child_nb = pidfd_open(living, PIDFD_NONBLOCK);
	exited = pidfd_open(gone, 0);
	zdtm_check(self >= 0 && child >= 0 && child_nb >= 0 && exited >= 0, "pidfd_open");
	zdtm_check(waitpid(gone, NULL, 0) == gone, "waitpid");
	printf("READY\n");
	fflush(stdout);
	for (long s = 1; s <= steps; s++) {
		zdtm_pace(pace);
		if (s % 25)
			continue;
		zdtm_check(!readable(self) && !readable(child) && !readable(child_nb),
			   "a living process's pidfd is readable at step %ld", s);
		zdtm_check(readable(exited), "the exited child's pidfd is not readable");
		zdtm_check(syscall(SYS_pidfd_send_signal, exited, 0, NULL, 0) < 0 && errno == ESRCH,
			   "the exited child's pidfd can be signalled");
		zdtm_check(syscall(SYS_pidfd_send_signal, self, 0, NULL, 0) == 0 &&
			   syscall(SYS_pidfd_send_signal, child, 0, NULL, 0) == 0,
			   "a living process's pidfd cannot be signalled");
		zdtm_check((fcntl(child_nb, F_GETFL) & O_NONBLOCK) && !(fcntl(child, F_GETFL) & O_NONBLOCK),
			   "O_NONBLOCK changed");
		zdtm_check(waitid(P_PIDFD, child_nb, &si, WEXITED) < 0 && errno == EAGAIN,
			   "a non-blocking wait did not say EAGAIN");
	}
	zdtm_hold();
	zdtm_check(syscall(SYS_pidfd_send_signal, child, SIGTERM, NULL, 0) == 0, "pidfd_send_signal");
	zdtm_check(waitid(P_PIDFD, child, &si, WEXITED) == 0 && si.si_pid == living &&
		   si.si_code == CLD_KILLED && si.si_status == SIGTERM, "waitid on the pidfd");
	zdtm_pass("pidfds");
	return 0;
}
