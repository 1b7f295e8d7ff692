/*
 * An allreduce loop: every step each rank contributes values derived from
 * the step and its rank (integers and doubles); every rank checks the
 * integer sum against the closed form and mixes both into its hash.
 * Rank 0 prints the final hash.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "../apps/zdtm.h"

static uint64_t mix(uint64_t h, uint64_t v)
{
	h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
	return h * 0xff51afd7ed558ccdULL;
}

int main(int argc, char **argv)
{
	long steps = argc > 1 ? atol(argv[1]) : 200, pace_ms = argc > 2 ? atol(argv[2]) : 10;
	int rank, size;
	uint64_t hash = 0;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (rank == 0) {
		printf("READY\n");
		fflush(stdout);
	}
	for (long step = 0; step < steps; step++) {
		int64_t mine[4], sum[4];
		double dmine = (step + 1) * 0.5 + rank / 3.0, dsum;

		for (int i = 0; i < 4; i++)
			mine[i] = step * 1000 + rank * 10 + i;
		MPI_Allreduce(mine, sum, 4, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
		MPI_Allreduce(&dmine, &dsum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
		for (int i = 0; i < 4; i++) {
			int64_t want = (step * 1000 + i) * size + 10LL * size * (size - 1) / 2;

			if (sum[i] != want) {
				printf("FAIL step %ld: sum %lld, expected %lld\n", step, (long long)sum[i],
				       (long long)want);
				MPI_Abort(MPI_COMM_WORLD, 1);
			}
			hash = mix(hash, sum[i]);
		}
		hash = mix(hash, (uint64_t)(dsum * 1e6));
		struct timespec ts = { 0, pace_ms * 1000000L };
		nanosleep(&ts, NULL);
	}
	zdtm_hold();	/* until the test's checkpoints are done */
	if (rank == 0) {
		printf("RESULT %016llx\nPASS\n", (unsigned long long)hash);
		fflush(stdout);
	}
	MPI_Finalize();
	return 0;
}
