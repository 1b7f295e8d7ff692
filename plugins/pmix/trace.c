/*
 * CKPT_PMIX_TRACE=FILE: a line per fence and get the rank made, for
 * diagnosis and for bench/slurm_bench.py, as CKPT_PMI_TRACE does for
 * PMI-2 (native/remote/pmi_proxy.c):
 *
 *	END_US RANK CALL BY MICROSECONDS STATUS
 *
 * END_US is CLOCK_MONOTONIC's at the answer, CALL "fence" or "get", BY
 * "server" (libpmix and slurmstepd answered, before any restart) or
 * "local" (the plugin and ckpt's name service, after one), MICROSECONDS
 * from the call to its answer (a non-blocking call's: to its callback),
 * STATUS the PMIx status.  The file is opened at PMIx_Init and, opened
 * O_APPEND by the rank, is restored with it.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "pmix_plugin.h"

static int trace_fd = -1;

void pmix_trace_open(void)
{
	const char *path = getenv("CKPT_PMIX_TRACE");

	if (path && *path && trace_fd < 0)
		trace_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
}

long long pmix_trace_now(void)
{
	struct timespec now;

	if (trace_fd < 0)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (long long)now.tv_sec * 1000000 + now.tv_nsec / 1000;
}

/* One write, so that lines of threads and ranks never mix. */
void pmix_trace(const char *call, int local, long long start_us, int status)
{
	long long end = pmix_trace_now();
	char line[160];
	int n;

	if (trace_fd < 0 || !start_us)
		return;
	n = snprintf(line, sizeof(line), "%lld %u %s %s %lld %d\n", end, pmix_state.me.rank,
		     call, local ? "local" : "server", end - start_us, status);
	if (write(trace_fd, line, (size_t)n) < 0)
		trace_fd = -1;
}
