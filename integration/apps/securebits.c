/*
 * securebits, each thread its own: the main thread keeps capabilities
 * across setuid (KEEP_CAPS) and forbids raising ambient ones; a worker
 * gives root no special powers at execve (NOROOT) and locks that.  Each
 * thread checks its bits at every step; they must be the same after a
 * restart (which runs as root: setting securebits needs CAP_SETPCAP).
 *
 *   securebits [steps] [ms-per-step]      (as root)
 */
#define _GNU_SOURCE
#include <linux/securebits.h>
#include <pthread.h>
#include <string.h>
#include <sys/prctl.h>
#include "zdtm.h"

#define MAIN_BITS (SECBIT_KEEP_CAPS | SECBIT_NO_CAP_AMBIENT_RAISE)
#define WORKER_BITS (SECBIT_NOROOT | SECBIT_NOROOT_LOCKED)

static volatile int done;

static void check_bits(int want, const char *who, long step)
{
	int bits = prctl(PR_GET_SECUREBITS);

	zdtm_check(bits == want, "%s, step %ld: securebits %#x, were %#x", who, step, bits, want);
}

static void *worker(void *arg)
{
	long step = 0;

	(void)arg;
	zdtm_check(prctl(PR_SET_SECUREBITS, WORKER_BITS) == 0, "worker: PR_SET_SECUREBITS: %s",
		   strerror(errno));
	while (!done) {
		check_bits(WORKER_BITS, "worker", step++);
		zdtm_pace(5);
	}
	check_bits(WORKER_BITS, "worker", step);
	return NULL;
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	uint64_t hash = 0;
	pthread_t t;

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(prctl(PR_SET_SECUREBITS, MAIN_BITS) == 0, "PR_SET_SECUREBITS: %s (run as root)",
		   strerror(errno));
	zdtm_check(pthread_create(&t, NULL, worker, NULL) == 0, "pthread_create");
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		check_bits(MAIN_BITS, "main thread", step);
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	zdtm_hold();
	done = 1;
	pthread_join(t, NULL);
	check_bits(MAIN_BITS, "main thread", steps);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
