/* The main thread calls pthread_exit while a worker goes on: such a
 * process cannot be checkpointed yet, and must say so and keep running. */
#include <pthread.h>
#include "zdtm.h"

static void *worker(void *arg)
{
	uint64_t h = 5;

	for (long s = 0; s < 200; s++) {
		h = zdtm_mix(h, s);
		zdtm_pace(10);
	}
	/* in the worker: the main thread is gone */
	zdtm_hold();
	zdtm_pass("%016llx", (unsigned long long)h);
	return arg;
}

int main(void)
{
	pthread_t th;

	zdtm_check(pthread_create(&th, NULL, worker, NULL) == 0, "pthread_create");
	printf("READY\n");
	fflush(stdout);
	pthread_exit(NULL);
}
