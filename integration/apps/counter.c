/* Single-threaded counter: a running hash over the steps, a 4 MiB table
 * filled at start whose contents are checked at the end, and its own pid
 * and /proc/self/exe, which must not change. */
#include <string.h>
#include "zdtm.h"

#define TABLE_WORDS (512 * 1024)

static uint64_t table[TABLE_WORDS];
static char exe_at_start[4096];

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	uint64_t seed = 42, hash = 0;

	pid_t pid = getpid();
	char exe[4096] = "";

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(readlink("/proc/self/exe", exe_at_start, sizeof(exe_at_start) - 1) > 0,
		   "readlink");
	for (long i = 0; i < TABLE_WORDS; i++)
		table[i] = zdtm_xorshift(&seed);
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		hash = zdtm_mix(hash, step);
		hash = zdtm_mix(hash, table[(hash >> 11) % TABLE_WORDS]);
		zdtm_pace(pace);
	}
	zdtm_hold();
	seed = 42;
	for (long i = 0; i < TABLE_WORDS; i++)
		zdtm_check(table[i] == zdtm_xorshift(&seed), "table word %ld changed", i);
	zdtm_check(getpid() == pid, "pid changed from %d to %d", (int)pid, (int)getpid());
	zdtm_check(readlink("/proc/self/exe", exe, sizeof(exe) - 1) > 0 &&
		   !strcmp(exe, exe_at_start), "/proc/self/exe is %s, was %s", exe, exe_at_start);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
