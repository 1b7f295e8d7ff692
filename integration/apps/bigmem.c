/* 512 MiB (or argv[3] MiB) of pseudo-random data, checksummed at start
 * and verified word by word at the end. */
#include <sys/mman.h>
#include "zdtm.h"

int main(int argc, char **argv)
{
	long steps = 200, pace = 10, mib = 512;
	uint64_t seed = 7, sum = 0, check = 0;
	uint64_t *mem;
	size_t words;

	zdtm_args(argc, argv, &steps, &pace);
	if (argc > 3)
		mib = atol(argv[3]);
	words = (size_t)mib << 17;
	mem = mmap(NULL, words * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	zdtm_check(mem != MAP_FAILED, "mmap %ld MiB", mib);
	for (size_t i = 0; i < words; i++)
		sum = zdtm_mix(sum, mem[i] = zdtm_xorshift(&seed));
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		/* keep touching it, so the image is taken mid-work */
		mem[(step * 7919) % words] ^= 0;
		zdtm_pace(pace);
	}
	zdtm_hold();
	seed = 7;
	for (size_t i = 0; i < words; i++) {
		zdtm_check(mem[i] == zdtm_xorshift(&seed), "word %zu differs", i);
		check = zdtm_mix(check, mem[i]);
	}
	zdtm_check(check == sum, "checksum differs");
	zdtm_pass("%016llx", (unsigned long long)sum);
	return 0;
}
