/* Runtime-overhead loops: loops compute|syscalls|malloc|clock|poll|epoll N
 * Prints the seconds the loop took.  poll and epoll wait on a ready pipe
 * with a timeout (the shim times such calls: timed_calls.c) and with none
 * (poll0, epoll0: straight to libc). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/syscall.h>

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	const char *kind = argc > 1 ? argv[1] : "compute";
	long n = argc > 2 ? atol(argv[2]) : 100000000;
	volatile uint64_t sink = 0;
	int null = open("/dev/null", O_WRONLY);
	int ready[2], ep = epoll_create1(0);
	struct epoll_event ev = { EPOLLIN, { 0 } };
	struct pollfd pfd;
	double t;

	if (pipe(ready) || write(ready[1], "x", 1) != 1 ||
	    epoll_ctl(ep, EPOLL_CTL_ADD, ready[0], &ev))
		return 1;
	pfd.fd = ready[0];
	pfd.events = POLLIN;
	t = now();

	if (!strcmp(kind, "compute")) {
		uint64_t x = 1;
		for (long i = 0; i < n; i++)
			x = x * 6364136223846793005ULL + 1442695040888963407ULL;
		sink = x;
	} else if (!strcmp(kind, "syscalls")) {
		struct timespec ts;
		for (long i = 0; i < n; i++) {
			sink += syscall(SYS_getpid);
			clock_gettime(CLOCK_MONOTONIC, &ts);
			sink += write(null, &ts, 8);
		}
	} else if (!strcmp(kind, "clock")) {
		struct timespec ts;
		for (long i = 0; i < n; i++) {
			clock_gettime(CLOCK_MONOTONIC, &ts);
			sink += ts.tv_nsec;
		}
	} else if (!strcmp(kind, "poll") || !strcmp(kind, "poll0")) {
		int timeout = kind[4] ? 0 : 1000;
		for (long i = 0; i < n; i++)
			sink += poll(&pfd, 1, timeout);
	} else if (!strcmp(kind, "epoll") || !strcmp(kind, "epoll0")) {
		int timeout = kind[5] ? 0 : 1000;
		for (long i = 0; i < n; i++)
			sink += epoll_wait(ep, &ev, 1, timeout);
	} else if (!strcmp(kind, "malloc")) {
		for (long i = 0; i < n; i++) {
			void *p = malloc(16 + (i & 1023));
			sink += (uintptr_t)p;
			free(p);
		}
	}
	printf("%.6f\n", now() - t);
	return 0;
}
