/* Benchmark job: MiB of memory (argv[1]) filled with incompressible data,
 * or touched only in part (argv[2] MiB of it touched, the rest untouched);
 * argv[3] "field": filled instead with a smooth double-precision field (a
 * Jacobi grid); "halfzero": every other page zero, the rest
 * incompressible; "mixed": what compresses as real programs' memory does
 * (half a field, text-like records, every other page of a quarter zero);
 * "dirty": incompressible, and each SIGUSR1 rewrites 5% of the pages
 * (scattered), then prints "DIRTIED n".
 * Prints READY, then a line per 5 ms tick so restart time can be seen. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static void fill_random(uint64_t *mem, size_t words)
{
	uint64_t x = 88172645463325252ULL;

	for (size_t i = 0; i < words; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		mem[i] = x;
	}
}

static void fill_field(double *grid, size_t len)
{
	size_t side = 1024;

	for (size_t i = 0; i < len / sizeof(double); i++) {
		double u = (double)(i % side) / side, v = (double)(i / side % side) / side;

		grid[i] = u * (1 - u) * v * (1 - v) * 16.0;
	}
}

/* written zeros: present pages, which a checkpointer must look at */
static void fill_halfzero(char *mem, size_t len)
{
	fill_random((uint64_t *)mem, len / 8);
	for (size_t at = 0; at + 4096 <= len; at += 8192)
		memset(mem + at, 0, 4096);
}

static void fill_mixed(char *mem, size_t len)
{
	static const char *words[] = { "rank ", "step ", "residual ", "0.000125 ", "converged\n",
				       "iteration ", "halo ", "exchange " };
	uint64_t x = 88172645463325252ULL;
	size_t at;

	fill_field((double *)mem, len / 2);
	for (at = len / 2; at < len;) {
		const char *w;
		size_t n;

		if (at >= len * 3 / 4 && (at / 4096) % 2) {	/* a zero page */
			at += 4096 - at % 4096;
			continue;
		}
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		w = words[x % 8];
		n = strlen(w) < len - at ? strlen(w) : len - at;
		memcpy(mem + at, w, n);
		at += n;
	}
}

static volatile sig_atomic_t dirty_asked;

static void ask_dirty(int sig)
{
	(void)sig;
	dirty_asked = 1;
}

/* Rewrite every page whose hash with this round falls in 1/20. */
static unsigned long dirty_pages(uint64_t *mem, size_t len, unsigned long round)
{
	unsigned long count = 0;

	for (size_t page = 0; page < len / 4096; page++) {
		uint64_t h = (page + 1) * 0x9e3779b97f4a7c15ULL ^ round * 0xff51afd7ed558ccdULL;

		if ((h >> 32) % 20)
			continue;
		for (size_t i = 0; i < 512; i++)
			mem[page * 512 + i] ^= h + i;
		count++;
	}
	return count;
}

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? atol(argv[1]) : 2048;
	size_t touch = argc > 2 ? (size_t)atol(argv[2]) : mib;
	const char *kind = argc > 3 ? argv[3] : "random";
	uint64_t *mem;
	struct timespec tick = { 0, 5 * 1000 * 1000 };

	mem = mmap(NULL, mib << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS |
		   MAP_NORESERVE, -1, 0);
	if (mem == MAP_FAILED)
		return 1;
	if (!strcmp(kind, "mixed"))
		fill_mixed((char *)mem, touch << 20);
	else if (!strcmp(kind, "field"))
		fill_field((double *)mem, touch << 20);
	else if (!strcmp(kind, "halfzero"))
		fill_halfzero((char *)mem, touch << 20);
	else
		fill_random(mem, touch << 17);
	if (!strcmp(kind, "dirty"))
		signal(SIGUSR1, ask_dirty);
	printf("READY\n");
	fflush(stdout);
	for (unsigned long n = 0, round = 0;; n++) {
		if (dirty_asked) {
			dirty_asked = 0;
			printf("DIRTIED %lu\n", dirty_pages(mem, touch << 20, ++round));
		}
		printf("tick %lu\n", n);
		fflush(stdout);
		nanosleep(&tick, NULL);
	}
}
