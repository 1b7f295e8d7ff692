/*
 * MPI_Comm_spawn in the middle of a ring: half the steps, the gate
 * (dynamic.h), then the ranks spawn one child of this program, which
 * answers rank 0 a mix of what it was sent; "SPAWN ok" and the answer, or
 * "SPAWN failed: ..." where the launcher cannot spawn (errors return);
 * then "DYNAMIC" and the other half.  The result is the ring's alone, so
 * it is the same whether the spawn worked or not.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynamic.h"

static int child(MPI_Comm parent)
{
	uint64_t v;

	MPI_Recv(&v, 1, MPI_UINT64_T, 0, 0, parent, MPI_STATUS_IGNORE);
	v = zdtm_mix(v, 42);
	MPI_Send(&v, 1, MPI_UINT64_T, 0, 0, parent);
	MPI_Comm_disconnect(&parent);
	MPI_Finalize();
	return 0;
}

int main(int argc, char **argv)
{
	long steps = argc > 1 ? atol(argv[1]) : 200, pace_ms = argc > 2 ? atol(argv[2]) : 10;
	char *child_argv[] = { "child", NULL };
	MPI_Comm parent, inter;
	uint64_t hash;
	int rank, err;

	MPI_Init(&argc, &argv);
	MPI_Comm_get_parent(&parent);
	if (parent != MPI_COMM_NULL)
		return child(parent);
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (rank == 0) {
		printf("READY\n");
		fflush(stdout);
	}
	hash = ring_steps(zdtm_mix(0, (uint64_t)rank), 0, steps / 2, pace_ms);
	gate();
	calling(rank);
	err = MPI_Comm_spawn(argv[0], child_argv, 1, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter,
			     MPI_ERRCODES_IGNORE);
	say(rank, "SPAWN", err);
	if (err == MPI_SUCCESS) {
		if (rank == 0) {
			uint64_t v = 7;

			MPI_Send(&v, 1, MPI_UINT64_T, 0, 0, inter);
			MPI_Recv(&v, 1, MPI_UINT64_T, 0, 0, inter, MPI_STATUS_IGNORE);
			printf("CHILD %s\n", v == zdtm_mix(7, 42) ? "answered" : "answered wrong");
		}
		MPI_Comm_disconnect(&inter);
	}
	if (rank == 0) {
		printf("DYNAMIC\n");
		fflush(stdout);
	}
	hash = ring_steps(hash, steps / 2, steps, pace_ms);
	zdtm_hold();
	result(rank, hash);
	MPI_Finalize();
	return 0;
}
