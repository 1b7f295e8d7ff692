/* pthread_join of a thread created before the checkpoint: the joiner
 * blocks on the thread's tid (CLONE_CHILD_CLEARTID) across the restart. */
#include <pthread.h>
#include "zdtm.h"

static long steps = 200, pace = 10;

static void *work(void *arg)
{
	uint64_t h = (uint64_t)(long)arg;

	for (long s = 0; s < steps; s++) {
		h = zdtm_mix(h, s);
		zdtm_pace(pace);
	}
	return (void *)h;
}

int main(int argc, char **argv)
{
	pthread_t th;
	void *ret;
	uint64_t want = 99;

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(pthread_create(&th, NULL, work, (void *)99L) == 0, "pthread_create");
	printf("READY\n");
	fflush(stdout);
	zdtm_check(pthread_join(th, &ret) == 0, "pthread_join");
	zdtm_hold();	/* after the join: the join itself must block across checkpoints */
	for (long s = 0; s < steps; s++)
		want = zdtm_mix(want, s);
	zdtm_check((uint64_t)ret == want, "thread result %llx", (unsigned long long)(uint64_t)ret);
	zdtm_pass("%016llx", (unsigned long long)want);
	return 0;
}
