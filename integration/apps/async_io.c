/*
 * Signal-driven I/O (O_ASYNC), as event loops without epoll use it: a
 * pipe's read end whose readiness is signalled with SIGRTMIN+2 to one
 * worker thread (F_SETOWN_EX F_OWNER_TID, F_SETSIG), and a socket whose
 * readiness is signalled with plain SIGIO to the process (F_SETOWN).  Each
 * step writes to both and waits for both signals, the first on the
 * worker, with the pipe's fd in its siginfo.
 *
 *   async_io [steps] [ms-per-step]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include "zdtm.h"

static volatile int rt_count, io_count, rt_fd = -1, rt_tid, done;
static volatile pid_t worker_tid;

static void on_rt(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	rt_fd = si->si_fd;
	rt_tid = syscall(SYS_gettid);
	rt_count++;
}

static void on_io(int sig)
{
	(void)sig;
	io_count++;
}

static void *worker(void *arg)
{
	sigset_t io;

	(void)arg;
	sigemptyset(&io);
	sigaddset(&io, SIGIO);	/* the process's SIGIO goes to the main thread */
	pthread_sigmask(SIG_BLOCK, &io, NULL);
	worker_tid = syscall(SYS_gettid);
	while (!done)
		zdtm_pace(1);
	return NULL;
}

static void wait_for(volatile int *count, int want, const char *what, long step)
{
	for (int i = 0; i < 2000 && *count < want; i++)
		zdtm_pace(1);
	zdtm_check(*count >= want, "step %ld: no %s signal", step, what);
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	struct sigaction rt = { .sa_sigaction = on_rt, .sa_flags = SA_SIGINFO | SA_RESTART };
	struct f_owner_ex owner = { .type = F_OWNER_TID };
	int p[2], sv[2];
	pthread_t th;
	char c;

	zdtm_args(argc, argv, &steps, &pace);
	sigemptyset(&rt.sa_mask);
	zdtm_check(sigaction(SIGRTMIN + 2, &rt, NULL) == 0, "sigaction");
	zdtm_check(signal(SIGIO, on_io) != SIG_ERR, "signal");
	zdtm_check(pipe(p) == 0 && socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "pipe");
	zdtm_check(pthread_create(&th, NULL, worker, NULL) == 0, "pthread_create");
	while (!worker_tid)
		zdtm_pace(1);
	owner.pid = worker_tid;
	zdtm_check(fcntl(p[0], F_SETOWN_EX, &owner) == 0 && fcntl(p[0], F_SETSIG, SIGRTMIN + 2) == 0 &&
		   fcntl(p[0], F_SETFL, O_ASYNC | O_NONBLOCK) == 0, "pipe O_ASYNC: %s", strerror(errno));
	zdtm_check(fcntl(sv[0], F_SETOWN, getpid()) == 0 &&
		   fcntl(sv[0], F_SETFL, O_ASYNC | O_NONBLOCK) == 0, "socket O_ASYNC: %s",
		   strerror(errno));
	printf("READY\n");
	fflush(stdout);
	for (long s = 1; s <= steps; s++) {
		int rt_want = rt_count + 1, io_want = io_count + 1;

		zdtm_check(write(p[1], "x", 1) == 1 && write(sv[1], "y", 1) == 1, "write");
		wait_for(&rt_count, rt_want, "SIGRTMIN+2", s);
		zdtm_check(rt_fd == p[0] && rt_tid == worker_tid,
			   "step %ld: SIGRTMIN+2 for fd %d on thread %d", s, rt_fd, rt_tid);
		wait_for(&io_count, io_want, "SIGIO", s);
		zdtm_check(read(p[0], &c, 1) == 1 && read(sv[0], &c, 1) == 1, "read");
		zdtm_pace(pace);
	}
	zdtm_hold();
	done = 1;
	pthread_join(th, NULL);
	zdtm_pass("signal-driven I/O kept");
	return 0;
}
