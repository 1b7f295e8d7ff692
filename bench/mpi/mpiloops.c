/* MPI ping-pong latency and an allreduce loop: prints the seconds each
 * took (rank 0), for the overhead tables.  mpiloops pingpong N [BYTES]. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
	const char *kind = argc > 1 ? argv[1] : "pingpong";
	long n = argc > 2 ? atol(argv[2]) : 100000;
	int bytes = argc > 3 ? atoi(argv[3]) : 8;
	int rank, size;
	char *buf = calloc(1, bytes);
	double t, v = 1, out;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	MPI_Barrier(MPI_COMM_WORLD);
	t = MPI_Wtime();
	for (long i = 0; i < n; i++) {
		if (!strcmp(kind, "pingpong")) {
			if (rank == 0) {
				MPI_Send(buf, bytes, MPI_CHAR, 1, 0, MPI_COMM_WORLD);
				MPI_Recv(buf, bytes, MPI_CHAR, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			} else if (rank == 1) {
				MPI_Recv(buf, bytes, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				MPI_Send(buf, bytes, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
			}
		} else {
			MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
		}
	}
	t = MPI_Wtime() - t;
	if (rank == 0)
		printf("%.6f\n", t);
	MPI_Finalize();
	return 0;
}
