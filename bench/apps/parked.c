/* Threads blocked in system calls, as a checkpoint finds them: parked N
 * starts N threads, each blocked in poll on a pipe that never becomes
 * ready (timeout 1 h, so the shim times it), says READY and waits. */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int never[2];

static void *blocked(void *arg)
{
	struct pollfd p = { never[0], POLLIN, 0 };

	for (;;)
		poll(&p, 1, 3600 * 1000);
	return arg;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 16;
	pthread_t t;

	if (pipe(never))
		return 1;
	for (int i = 0; i < n; i++)
		if (pthread_create(&t, NULL, blocked, NULL))
			return 1;
	printf("READY\n");
	fflush(stdout);
	for (;;)
		pause();
}
