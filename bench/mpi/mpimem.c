/* Each rank fills MIB MiB with random data, then ticks: rank 0 writes a
 * line every 50 ms (the benchmark sees a restarted job write again). */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv)
{
	long mib = argc > 1 ? atol(argv[1]) : 512;
	uint64_t *p, x = 88172645463325252ULL, sum = 0;
	size_t n = (size_t)mib << 17;
	int rank;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	p = malloc(n * 8);
	x += rank;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = x;
	}
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0) {
		printf("READY\n");
		fflush(stdout);
	}
	for (long t = 0;; t++) {
		struct timespec ts = { 0, 50000000 };

		sum += p[(t * 4099) % n];
		MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_UINT64_T, MPI_BXOR, MPI_COMM_WORLD);
		if (rank == 0) {
			printf("tick %ld %llx\n", t, (unsigned long long)sum);
			fflush(stdout);
		}
		nanosleep(&ts, NULL);
	}
}
