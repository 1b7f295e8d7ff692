/*
 * A ring: every rank passes a token to the next, with several messages in
 * flight per rank (nonblocking sends of a window of steps), each step
 * mixing what it received.  Rank 0 prints the final mix of all ranks.
 * Paced, so checkpoints land with messages in flight.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "../apps/zdtm.h"

#define WINDOW 4

static uint64_t mix(uint64_t h, uint64_t v)
{
	h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
	return h * 0xff51afd7ed558ccdULL;
}

int main(int argc, char **argv)
{
	long steps = argc > 1 ? atol(argv[1]) : 200, pace_ms = argc > 2 ? atol(argv[2]) : 10;
	int rank, size;
	uint64_t out[WINDOW], in[WINDOW], hash = 0, total = 0;
	MPI_Request reqs[2 * WINDOW];

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	hash = mix(0, rank);
	if (rank == 0) {
		printf("READY\n");
		fflush(stdout);
	}
	for (long step = 0; step < steps; step++) {
		for (int w = 0; w < WINDOW; w++) {
			out[w] = mix(hash, step * WINDOW + w);
			MPI_Irecv(&in[w], 1, MPI_UINT64_T, (rank + size - 1) % size, w, MPI_COMM_WORLD,
				  &reqs[w]);
			MPI_Isend(&out[w], 1, MPI_UINT64_T, (rank + 1) % size, w, MPI_COMM_WORLD,
				  &reqs[WINDOW + w]);
		}
		MPI_Waitall(2 * WINDOW, reqs, MPI_STATUSES_IGNORE);
		for (int w = 0; w < WINDOW; w++)
			hash = mix(hash, in[w]);
		struct timespec ts = { 0, pace_ms * 1000000L };
		nanosleep(&ts, NULL);
	}
	zdtm_hold();	/* slow checkpoints (verbs, a loaded machine) never outrun it */
	MPI_Reduce(&hash, &total, 1, MPI_UINT64_T, MPI_BXOR, 0, MPI_COMM_WORLD);
	if (rank == 0) {
		printf("RESULT %016llx\nPASS\n", (unsigned long long)total);
		fflush(stdout);
	}
	MPI_Finalize();
	return 0;
}
