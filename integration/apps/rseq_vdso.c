/* sched_getcpu() (served from the rseq area) and clock_gettime() (from the
 * vDSO) in a loop: the rseq area must be registered again after restart
 * and the vDSO must be where libc remembers it. */
#define _GNU_SOURCE
#include <sched.h>
#include <sys/rseq.h>
#include <sys/syscall.h>
#include "zdtm.h"

static int rseq_cpu(void)
{
	struct rseq *area = (struct rseq *)((char *)__builtin_thread_pointer() + __rseq_offset);

	return (int)area->cpu_id;
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10, calls = 0;
	long ncpu = sysconf(_SC_NPROCESSORS_CONF);
	struct timespec last = { 0, 0 }, now;

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(__rseq_size > 0, "glibc did not register rseq");
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		for (int i = 0; i < 1000; i++) {
			int cpu = sched_getcpu();

			zdtm_check(cpu >= 0 && cpu < ncpu, "sched_getcpu %d", cpu);
			zdtm_check(rseq_cpu() >= 0 && rseq_cpu() < ncpu,
				   "rseq area not registered (cpu_id %d)", rseq_cpu());
			zdtm_check(clock_gettime(CLOCK_MONOTONIC, &now) == 0, "clock_gettime");
			zdtm_check(now.tv_sec > last.tv_sec ||
				   (now.tv_sec == last.tv_sec && now.tv_nsec >= last.tv_nsec),
				   "CLOCK_MONOTONIC went back");
			last = now;
			calls++;
		}
		zdtm_pace(pace);
	}
	zdtm_hold();
	/* once more: a restart during the hold must have registered it too */
	zdtm_check(rseq_cpu() >= 0 && rseq_cpu() < ncpu && sched_getcpu() >= 0,
		   "after the hold: rseq area not registered (cpu_id %d)", rseq_cpu());
	zdtm_check(clock_gettime(CLOCK_MONOTONIC, &now) == 0 &&
		   (now.tv_sec > last.tv_sec || (now.tv_sec == last.tv_sec && now.tv_nsec >= last.tv_nsec)),
		   "after the hold: CLOCK_MONOTONIC went back");
	zdtm_pass("%ld", calls);
	return 0;
}
