/* Runtime-overhead loops: loops compute|syscalls|malloc|clock N
 * Prints the seconds the loop took. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>
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
	double t = now();

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
