/* Single-threaded counter: a running hash over the steps, and a 4 MiB
 * table filled at start whose contents are checked at the end. */
#include <string.h>
#include "zdtm.h"

#define TABLE_WORDS (512 * 1024)

static uint64_t table[TABLE_WORDS];

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	uint64_t seed = 42, hash = 0;

	zdtm_args(argc, argv, &steps, &pace);
	for (long i = 0; i < TABLE_WORDS; i++)
		table[i] = zdtm_xorshift(&seed);
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		hash = zdtm_mix(hash, step);
		hash = zdtm_mix(hash, table[(hash >> 11) % TABLE_WORDS]);
		zdtm_pace(pace);
	}
	seed = 42;
	for (long i = 0; i < TABLE_WORDS; i++)
		zdtm_check(table[i] == zdtm_xorshift(&seed), "table word %ld changed", i);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
