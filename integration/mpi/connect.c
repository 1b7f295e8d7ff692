/*
 * MPI_Open_port, MPI_Publish_name / MPI_Lookup_name and
 * MPI_Comm_accept / MPI_Comm_connect in the middle of a ring: half the
 * steps, the gate (dynamic.h), then the even ranks accept and the odd
 * ones connect (one intercommunicator between the halves), over a port
 * name rank 0 publishes ("PUBLISH ok" or "PUBLISH failed: ..."; if
 * publishing fails, rank 0 broadcasts the name instead); an exchange over
 * it, "CONNECT ok" or "CONNECT failed: ...", "DYNAMIC", the other half.
 * The result is the ring's alone.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynamic.h"

#define SERVICE "ckpt-connect-test"

int main(int argc, char **argv)
{
	long steps = argc > 1 ? atol(argv[1]) : 200, pace_ms = argc > 2 ? atol(argv[2]) : 10;
	char port[MPI_MAX_PORT_NAME] = "";
	MPI_Comm half, inter;
	uint64_t hash;
	int rank, size, err, published = 0;

	MPI_Init(&argc, &argv);
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (rank == 0) {
		printf("READY\n");
		fflush(stdout);
	}
	hash = ring_steps(zdtm_mix(0, (uint64_t)rank), 0, steps / 2, pace_ms);
	gate();
	calling(rank);
	MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
	MPI_Comm_set_errhandler(half, MPI_ERRORS_RETURN);
	if (rank == 0) {
		err = MPI_Open_port(MPI_INFO_NULL, port);
		if (err == MPI_SUCCESS)
			err = MPI_Publish_name(SERVICE, MPI_INFO_NULL, port);
		published = err == MPI_SUCCESS;
		say(rank, "PUBLISH", err);
	}
	MPI_Bcast(&published, 1, MPI_INT, 0, MPI_COMM_WORLD);
	if (published) {
		MPI_Barrier(MPI_COMM_WORLD);	/* published before anyone looks */
		if (rank == 1)
			err = MPI_Lookup_name(SERVICE, MPI_INFO_NULL, port);
	} else {
		MPI_Bcast(port, MPI_MAX_PORT_NAME, MPI_CHAR, 0, MPI_COMM_WORLD);
	}
	if (published && rank == 1 && err != MPI_SUCCESS)
		port[0] = '\0';
	/* the odd half's root (world rank 1) has the name; accept at world rank 0 */
	if (rank % 2 == 0)
		err = MPI_Comm_accept(port, MPI_INFO_NULL, 0, half, &inter);
	else
		err = MPI_Comm_connect(port, MPI_INFO_NULL, 0, half, &inter);
	MPI_Allreduce(MPI_IN_PLACE, &err, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	if (err == MPI_SUCCESS && rank < 2) {	/* the halves' roots, each other's rank 0 */
		int mine = rank, theirs = -1;

		MPI_Sendrecv(&mine, 1, MPI_INT, 0, 0, &theirs, 1, MPI_INT, 0, 0, inter,
			     MPI_STATUS_IGNORE);
		if (theirs != 1 - rank)
			zdtm_fail("rank %d heard %d over the intercommunicator", rank, theirs);
	}
	say(rank, "CONNECT", err);
	if (err == MPI_SUCCESS)
		MPI_Comm_disconnect(&inter);
	if (published && rank == 0)
		MPI_Unpublish_name(SERVICE, MPI_INFO_NULL, port);
	if (rank == 0 && port[0])
		MPI_Close_port(port);
	MPI_Comm_free(&half);
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
