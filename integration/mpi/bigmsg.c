/*
 * Large messages between neighbours: 1 MiB each way per step, far above
 * the eager limits, so both stacks move them with a single copy between
 * processes (process_vm_readv: Open MPI's vader CMA, UCX's cma transport).
 * After a restart that copy must still reach the peer at the same pid and
 * addresses.  Every buffer is filled from (step, sender) and checked on
 * arrival; rank 0 prints the hash of all of them.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "../apps/zdtm.h"

#define WORDS (1 << 17)		/* 1 MiB of uint64_t */

static uint64_t mix(uint64_t h, uint64_t v)
{
	h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
	return h * 0xff51afd7ed558ccdULL;
}

static void fill(uint64_t *buf, long step, int sender)
{
	uint64_t x = mix(step, sender);

	for (long i = 0; i < WORDS; i++)
		buf[i] = x = mix(x, i);
}

static int check(const uint64_t *buf, long step, int sender)
{
	uint64_t x = mix(step, sender);

	for (long i = 0; i < WORDS; i++)
		if (buf[i] != (x = mix(x, i)))
			return 0;
	return 1;
}

int main(int argc, char **argv)
{
	long steps = argc > 1 ? atol(argv[1]) : 200, pace_ms = argc > 2 ? atol(argv[2]) : 10;
	uint64_t *out = malloc(WORDS * sizeof(uint64_t)), *in = malloc(WORDS * sizeof(uint64_t));
	uint64_t hash, total = 0;
	int rank, size, bad = 0, all_bad = 0;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	hash = mix(0, rank);
	if (rank == 0) {
		printf("READY\n");
		fflush(stdout);
	}
	for (long step = 0; step < steps; step++) {
		int next = (rank + 1) % size, prev = (rank + size - 1) % size;

		fill(out, step, rank);
		MPI_Sendrecv(out, WORDS, MPI_UINT64_T, next, 0, in, WORDS, MPI_UINT64_T, prev, 0,
			     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		if (!check(in, step, prev) && !bad++)
			fprintf(stderr, "FAIL rank %d: step %ld from %d is wrong\n", rank, step, prev);
		hash = mix(hash, in[step % WORDS]);
		struct timespec ts = { 0, pace_ms * 1000000L };
		nanosleep(&ts, NULL);
	}
	zdtm_hold();	/* until the test's checkpoints are done */
	MPI_Reduce(&hash, &total, 1, MPI_UINT64_T, MPI_BXOR, 0, MPI_COMM_WORLD);
	MPI_Reduce(&bad, &all_bad, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
	if (rank == 0) {
		printf("RESULT %016llx\n%s\n", (unsigned long long)total, all_bad ? "FAIL" : "PASS");
		fflush(stdout);
	}
	MPI_Finalize();
	return 0;
}
