/*
 * A 2D Jacobi stencil: an N x N grid split in strips of rows, halo rows
 * exchanged with MPI_Sendrecv every step, the residual reduced with
 * MPI_Allreduce every 10 steps.  Rank 0 prints the final residual.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "../apps/zdtm.h"

#define N 256

int main(int argc, char **argv)
{
	long steps = argc > 1 ? atol(argv[1]) : 200, pace_ms = argc > 2 ? atol(argv[2]) : 10;
	int rank, size, rows, up, down;
	double *u, *v, residual = 0;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	rows = N / size;
	up = rank > 0 ? rank - 1 : MPI_PROC_NULL;
	down = rank < size - 1 ? rank + 1 : MPI_PROC_NULL;
	u = calloc((rows + 2) * N, sizeof(double));
	v = calloc((rows + 2) * N, sizeof(double));
	for (int i = 1; i <= rows; i++)		/* a hot left edge, a warm top */
		u[i * N] = v[i * N] = 100.0;
	if (rank == 0)
		for (int j = 0; j < N; j++)
			u[N + j] = v[N + j] = 50.0;
	if (rank == 0) {
		printf("READY\n");
		fflush(stdout);
	}
	for (long step = 0; step < steps; step++) {
		double local = 0;

		MPI_Sendrecv(&u[1 * N], N, MPI_DOUBLE, up, 0, &u[(rows + 1) * N], N, MPI_DOUBLE,
			     down, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		MPI_Sendrecv(&u[rows * N], N, MPI_DOUBLE, down, 1, &u[0], N, MPI_DOUBLE, up, 1,
			     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		for (int i = 1; i <= rows; i++) {
			if ((rank == 0 && i == 1) || (rank == size - 1 && i == rows))
				continue;	/* fixed boundary rows */
			for (int j = 1; j < N - 1; j++) {
				v[i * N + j] = 0.25 * (u[(i - 1) * N + j] + u[(i + 1) * N + j] +
						       u[i * N + j - 1] + u[i * N + j + 1]);
				local += fabs(v[i * N + j] - u[i * N + j]);
			}
		}
		memcpy(u + N, v + N, rows * N * sizeof(double));
		if (step % 10 == 9)
			MPI_Allreduce(&local, &residual, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
		struct timespec ts = { 0, pace_ms * 1000000L };
		nanosleep(&ts, NULL);
	}
	zdtm_hold();	/* until the test's checkpoints are done */
	if (rank == 0) {
		printf("RESULT residual %.12e\nPASS\n", residual);
		fflush(stdout);
	}
	MPI_Finalize();
	return 0;
}
