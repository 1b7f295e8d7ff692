/* Benchmark job: MiB of memory (argv[1]) filled with incompressible data,
 * or touched only in part (argv[2] MiB of it touched, the rest untouched).
 * Prints READY, then a line per 5 ms tick so restart time can be seen. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? atol(argv[1]) : 2048;
	size_t touch = argc > 2 ? atol(argv[2]) : mib;
	size_t words = touch << 17;
	uint64_t x = 88172645463325252ULL, *mem;
	struct timespec tick = { 0, 5 * 1000 * 1000 };

	mem = mmap(NULL, mib << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS |
		   MAP_NORESERVE, -1, 0);
	if (mem == MAP_FAILED)
		return 1;
	for (size_t i = 0; i < words; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		mem[i] = x;
	}
	printf("READY\n");
	fflush(stdout);
	for (unsigned long n = 0;; n++) {
		printf("tick %lu\n", n);
		fflush(stdout);
		nanosleep(&tick, NULL);
	}
}
