/* Memory of a chosen kind, as checkpoint compression meets it, rebuilt
 * from its seed and compared byte by byte at the end:
 *   mixed:  a smooth double-precision field (a Jacobi grid), text-like
 *           records and half zero pages, in one region (compresses well);
 *   random: pseudo-random words (does not compress).
 * Arguments: steps pace MiB kind. */
#include <string.h>
#include <sys/mman.h>
#include "zdtm.h"

#define PAGE 4096

static void fill_grid(double *d, size_t n)
{
	size_t side = 1024;

	for (size_t i = 0; i < n; i++) {
		double x = (double)(i % side) / side, y = (double)(i / side % side) / side;

		d[i] = x * (1 - x) * y * (1 - y) * 16.0;	/* steady state of a heat problem */
	}
}

static void fill_text(char *p, size_t len, uint64_t *seed)
{
	static const char *words[] = { "rank ", "step ", "residual ", "0.000125 ", "converged\n",
				       "iteration ", "halo ", "exchange " };
	size_t at = 0;

	while (at < len) {
		const char *w = words[zdtm_xorshift(seed) % 8];
		size_t n = strlen(w);

		if (n > len - at)
			n = len - at;
		memcpy(p + at, w, n);
		at += n;
	}
}

/* The region as it must be: the program's own state, made again. */
static void fill(char *mem, size_t len, int random)
{
	uint64_t seed = 11;

	if (random) {
		for (size_t i = 0; i < len / 8; i++)
			((uint64_t *)mem)[i] = zdtm_xorshift(&seed);
		return;
	}
	/* four quarters: grid, text, every other page zero, grid again */
	fill_grid((double *)mem, len / 4 / sizeof(double));
	fill_text(mem + len / 4, len / 4, &seed);
	for (size_t off = len / 2; off < len * 3 / 4; off += 2 * PAGE)
		fill_text(mem + off, PAGE, &seed);
	fill_grid((double *)(mem + len * 3 / 4), len / 4 / sizeof(double));
}

int main(int argc, char **argv)
{
	long steps = 200, pace = 10, mib = 64;
	int random;
	char *mem, *want;
	size_t len;
	uint64_t sum = 0;

	zdtm_args(argc, argv, &steps, &pace);
	if (argc > 3)
		mib = atol(argv[3]);
	random = argc > 4 && !strcmp(argv[4], "random");
	len = (size_t)mib << 20;
	mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	zdtm_check(mem != MAP_FAILED, "mmap %ld MiB", mib);
	fill(mem, len, random);
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		mem[(step * 7919) % len] ^= 0;	/* touched mid-work */
		zdtm_pace(pace);
	}
	zdtm_hold();
	want = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	zdtm_check(want != MAP_FAILED, "mmap %ld MiB", mib);
	fill(want, len, random);
	for (size_t off = 0; off < len; off += PAGE)
		zdtm_check(!memcmp(mem + off, want + off, PAGE), "page at offset %zu differs", off);
	for (size_t i = 0; i < len / 8; i++)
		sum = zdtm_mix(sum, ((uint64_t *)mem)[i]);
	zdtm_pass("%016llx", (unsigned long long)sum);
	return 0;
}
