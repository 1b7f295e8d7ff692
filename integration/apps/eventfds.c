/*
 * eventfd, timerfd, signalfd and an epoll set watching them and a pipe.
 * Each step: the eventfd is bumped, a SIGUSR1 is raised (blocked, so it
 * waits for the signalfd), a byte goes into the pipe, and epoll must
 * report exactly those fds, with the data tags they were added with.
 * Every tenth step the eventfd (a semaphore one and a counting one) is
 * read; the timerfd, ticking every 2 ms, must keep ticking throughout.
 * Checkpoints land with counts, a pending signal and pipe bytes waiting.
 */
#include <signal.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include "zdtm.h"

enum { T_COUNT = 0x1111, T_SEM = 0x2222, T_SIG = 0x3333, T_PIPE = 0x4444, T_TIMER = 0x5555 };

static void watch(int ep, int fd, uint64_t tag)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = tag };

	zdtm_check(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0, "epoll_ctl %llx",
		   (unsigned long long)tag);
}

int main(int argc, char **argv)
{
	long steps = 200, pace = 10, ticks = 0;
	int count = eventfd(0, EFD_NONBLOCK), sem = eventfd(0, EFD_SEMAPHORE | EFD_NONBLOCK);
	int timer = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
	int ep = epoll_create1(0), sfd, p[2];
	struct itimerspec its = { { 0, 2000000 }, { 0, 2000000 } };
	uint64_t hash = 0, v;
	sigset_t usr1;

	zdtm_args(argc, argv, &steps, &pace);
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	zdtm_check(sigprocmask(SIG_BLOCK, &usr1, NULL) == 0, "sigprocmask");
	sfd = signalfd(-1, &usr1, SFD_NONBLOCK);
	zdtm_check(count >= 0 && sem >= 0 && timer >= 0 && ep >= 0 && sfd >= 0 && pipe(p) == 0,
		   "create");
	zdtm_check(timerfd_settime(timer, 0, &its, NULL) == 0, "timerfd_settime");
	watch(ep, count, T_COUNT);
	watch(ep, sem, T_SEM);
	watch(ep, sfd, T_SIG);
	watch(ep, p[0], T_PIPE);
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		struct epoll_event evs[8];
		struct signalfd_siginfo si;
		uint64_t seen = 0;
		char c = (char)step;
		int n;

		v = step + 1;
		zdtm_check(write(count, &v, sizeof(v)) == sizeof(v), "eventfd write");
		v = 2;
		zdtm_check(write(sem, &v, sizeof(v)) == sizeof(v), "semaphore write");
		zdtm_check(write(p[1], &c, 1) == 1, "pipe write");
		kill(getpid(), SIGUSR1);
		zdtm_pace(pace);	/* checkpoints land here: all of it pending */
		n = epoll_wait(ep, evs, 8, 1000);
		for (int i = 0; i < n; i++)
			seen |= 1ULL << ((evs[i].data.u64 >> 12) & 7);
		zdtm_check(seen == 0x1e, "step %ld: epoll saw %llx", step, (unsigned long long)seen);
		zdtm_check(read(sfd, &si, sizeof(si)) == sizeof(si) && si.ssi_signo == SIGUSR1,
			   "signalfd");
		zdtm_check(read(p[0], &c, 1) == 1 && c == (char)step, "pipe byte");
		zdtm_check(read(sem, &v, sizeof(v)) == sizeof(v) && v == 1, "semaphore read");
		if (step % 10 == 9) {
			zdtm_check(read(count, &v, sizeof(v)) == sizeof(v), "eventfd read");
			zdtm_check(v == (uint64_t)(step * 10 - 35), "eventfd count %llu at step %ld",
				   (unsigned long long)v, step);
			hash = zdtm_mix(hash, v);
			while (read(sem, &v, sizeof(v)) == sizeof(v))
				hash = zdtm_mix(hash, v);
		}
		if (read(timer, &v, sizeof(v)) == sizeof(v))
			ticks += v;
	}
	/* after the steps' tick count; only that the timer still ticks is checked after */
	zdtm_hold();
	zdtm_pace(10);
	zdtm_check(read(timer, &v, sizeof(v)) == sizeof(v) && v > 0, "the timer stopped");
	zdtm_check(ticks > steps / 2, "only %ld timer ticks", ticks);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
