/*
 * A PMI-1 client speaking the wire protocol itself over PMI_FD, as MPICH
 * does under srun --mpi=pmi2: at each step every task puts a value, enters
 * a barrier and gets every other task's value of that step, which it
 * checks.  Under ckpt its requests go through its task server's PMI proxy
 * (native/remote/pmi_proxy.c): relayed to slurmstepd before a restart,
 * answered by ckpt's name service after one, barrier after barrier.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "zdtm.h"

static int pmi_fd;

/* One request line, and its answer line into answer. */
static void ask(const char *request, char *answer, size_t size)
{
	size_t n = 0;

	zdtm_check(write(pmi_fd, request, strlen(request)) == (ssize_t)strlen(request),
		   "PMI write: %s", request);
	while (n + 1 < size) {
		zdtm_check(read(pmi_fd, answer + n, 1) == 1, "PMI read after %s", request);
		if (answer[n++] == '\n')
			break;
	}
	answer[n] = '\0';
}

static void field(const char *line, const char *name, char *out, size_t size)
{
	const char *p = strstr(line, name);

	out[0] = '\0';
	if (p)
		snprintf(out, size, "%.*s", (int)strcspn(p + strlen(name), " \n"), p + strlen(name));
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	char answer[1024], request[256], value[256], kvs[128], want[64];
	uint64_t hash = 0;
	int rank, size;

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(getenv("PMI_FD") && getenv("PMI_RANK") && getenv("PMI_SIZE"),
		   "no PMI_FD, PMI_RANK, PMI_SIZE: run by srun --mpi=pmi2");
	pmi_fd = atoi(getenv("PMI_FD"));
	rank = atoi(getenv("PMI_RANK"));
	size = atoi(getenv("PMI_SIZE"));
	ask("cmd=init pmi_version=1 pmi_subversion=1\n", answer, sizeof(answer));
	zdtm_check(strstr(answer, "rc=0"), "PMI init: %s", answer);
	ask("cmd=get_my_kvsname\n", answer, sizeof(answer));
	field(answer, "kvsname=", kvs, sizeof(kvs));
	zdtm_check(kvs[0], "no kvsname: %s", answer);
	if (rank == 0)
		printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		snprintf(request, sizeof(request), "cmd=put kvsname=%s key=s%ld-r%d value=v%ld.%d\n",
			 kvs, step, rank, step * 7 + rank, rank);
		ask(request, answer, sizeof(answer));
		zdtm_check(strstr(answer, "rc=0"), "put at step %ld: %s", step, answer);
		ask("cmd=barrier_in\n", answer, sizeof(answer));
		zdtm_check(!strncmp(answer, "cmd=barrier_out", 15), "barrier at step %ld: %s", step,
			   answer);
		for (int r = 0; r < size; r++) {
			snprintf(request, sizeof(request), "cmd=get kvsname=%s key=s%ld-r%d\n", kvs,
				 step, r);
			ask(request, answer, sizeof(answer));
			field(answer, "value=", value, sizeof(value));
			snprintf(want, sizeof(want), "v%ld.%d", step * 7 + r, r);
			zdtm_check(!strcmp(value, want), "step %ld: task %d's value %s, expected %s",
				   step, r, value, want);
		}
		hash = zdtm_mix(hash, step * size);
		zdtm_pace(pace);
	}
	zdtm_hold();
	ask("cmd=finalize\n", answer, sizeof(answer));
	zdtm_check(!strncmp(answer, "cmd=finalize_ack", 16), "finalize: %s", answer);
	if (rank == 0)
		zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
