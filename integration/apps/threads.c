/* 8 threads: a mutex-protected shared counter, a condition variable that
 * passes a token around the ring of threads in order, and __thread
 * counters that must survive with each thread. */
#include <pthread.h>
#include "zdtm.h"

#define NTHREADS 8

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t turn_changed = PTHREAD_COND_INITIALIZER;
static long turn;			/* whose turn: turn % NTHREADS */
static long shared_total;
static uint64_t shared_hash;
static long steps = 40, pace = 5;
static __thread long my_rounds;
static __thread uint64_t my_hash;

static void *worker(void *arg)
{
	long id = (long)arg;

	my_hash = id;
	for (long r = 0; r < steps; r++) {
		pthread_mutex_lock(&lock);
		while (turn % NTHREADS != id)
			pthread_cond_wait(&turn_changed, &lock);
		shared_total++;
		shared_hash = zdtm_mix(shared_hash, id * 1000 + r);
		my_rounds++;
		my_hash = zdtm_mix(my_hash, r);
		turn++;
		pthread_cond_broadcast(&turn_changed);
		pthread_mutex_unlock(&lock);
		zdtm_pace(pace);
	}
	/* the thread's own TLS, checked by the thread itself */
	uint64_t want = id;
	for (long r = 0; r < steps; r++)
		want = zdtm_mix(want, r);
	if (my_rounds != steps || my_hash != want)
		return (void *)1;
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t th[NTHREADS];

	zdtm_args(argc, argv, &steps, &pace);
	for (long i = 0; i < NTHREADS; i++)
		zdtm_check(pthread_create(&th[i], NULL, worker, (void *)i) == 0, "pthread_create");
	printf("READY\n");
	fflush(stdout);
	for (long i = 0; i < NTHREADS; i++) {
		void *ret;

		zdtm_check(pthread_join(th[i], &ret) == 0, "pthread_join %ld", i);
		zdtm_check(ret == NULL, "thread %ld: __thread state lost", i);
	}
	zdtm_hold();	/* after the joins: they must block across checkpoints */
	zdtm_check(shared_total == steps * NTHREADS, "shared total %ld", shared_total);
	zdtm_pass("%ld %016llx", shared_total, (unsigned long long)shared_hash);
	return 0;
}
