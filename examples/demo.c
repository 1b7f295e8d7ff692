/* The demo job: counts to 60, one step every 100 ms, keeping a running sum
 * in memory.  Checkpointed, killed and restarted, it carries on where the
 * checkpoint was taken and ends with the same sum. */
#include <stdio.h>
#include <time.h>

int main(void)
{
	unsigned long long sum = 0;
	struct timespec step = { 0, 100 * 1000 * 1000 };

	for (int i = 1; i <= 60; i++) {
		sum += (unsigned long long)i * i;
		if (i % 5 == 0) {
			printf("demo: step %2d, sum of squares %llu\n", i, sum);
			fflush(stdout);
		}
		nanosleep(&step, NULL);
	}
	printf("demo: done, sum of squares 1..60 = %llu (expected 73810)\n", sum);
	return sum == 73810 ? 0 : 1;
}
