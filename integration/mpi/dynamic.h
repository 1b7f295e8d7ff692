/*
 * What the programs with a dynamic-process call (spawn.c, connect.c)
 * share: a paced ring, whose mix alone is the result, and a gate before
 * the call, so that a test can checkpoint before it and after it.
 */
#ifndef DYNAMIC_H
#define DYNAMIC_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include "../apps/zdtm.h"

/* steps of a ring: each rank passes its hash on and mixes in its left one */
static inline uint64_t ring_steps(uint64_t hash, long first, long last, long pace_ms)
{
	int rank, size;
	uint64_t in;

	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	for (long step = first; step < last; step++) {
		uint64_t out = zdtm_mix(hash, (uint64_t)step);

		MPI_Sendrecv(&out, 1, MPI_UINT64_T, (rank + 1) % size, 0, &in, 1, MPI_UINT64_T,
			     (rank + size - 1) % size, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		hash = zdtm_mix(hash, in);
		zdtm_pace(pace_ms);
	}
	return hash;
}

/* Every rank waits while the file named by $ZDTM_GATE exists (rank 0
 * looks, the others wait in a broadcast). */
static inline void gate(void)
{
	const char *path = getenv("ZDTM_GATE");
	int rank, go = 1;

	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (rank == 0)
		while (path && access(path, F_OK) == 0)
			zdtm_pace(10);
	MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD);
}

/* "CALLING", by rank 0, just before the call: where a launcher never
 * answers it (Open MPI's spawn under srun --mpi=pmix), what the test
 * waits for */
static inline void calling(int rank)
{
	if (rank == 0) {
		printf("CALLING\n");
		fflush(stdout);
	}
}

/* "WHAT ok" or "WHAT failed: <MPI's error string>", by rank 0 */
static inline void say(int rank, const char *what, int err)
{
	char text[MPI_MAX_ERROR_STRING] = "";
	int len = 0;

	if (rank != 0)
		return;
	if (err == MPI_SUCCESS) {
		printf("%s ok\n", what);
	} else {
		MPI_Error_string(err, text, &len);
		printf("%s failed: %s\n", what, text);
	}
	fflush(stdout);
}

static inline void result(int rank, uint64_t hash)
{
	uint64_t total = 0;

	MPI_Reduce(&hash, &total, 1, MPI_UINT64_T, MPI_BXOR, 0, MPI_COMM_WORLD);
	if (rank == 0) {
		printf("RESULT %016llx\nPASS\n", (unsigned long long)total);
		fflush(stdout);
	}
}

#endif
