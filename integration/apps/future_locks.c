/*
 * mlockall(MCL_FUTURE | MCL_ONFAULT), as programs that register memory for
 * RDMA or keep their heap out of swap call it: every region mapped later
 * is locked (the kernel's default flags for new regions, which no file
 * shows).  At every step a new region must come locked on fault (its
 * VmFlags in smaps), before and after a restart.
 *
 *   future_locks [steps] [ms-per-step]
 */
#define _GNU_SOURCE
#include <string.h>
#include <sys/mman.h>
#include "zdtm.h"

#define REGION (64 << 10)

/* The VmFlags line of the region at p, from /proc/self/smaps. */
static void vm_flags_of(const void *p, char *flags, size_t size)
{
	char line[512], want[32];
	int found = 0;
	FILE *f = fopen("/proc/self/smaps", "r");

	zdtm_check(f != NULL, "/proc/self/smaps");
	snprintf(want, sizeof(want), "%lx-", (unsigned long)p);
	flags[0] = '\0';
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, want, strlen(want)))
			found = 1;
		else if (found && !strncmp(line, "VmFlags:", 8)) {
			snprintf(flags, size, "%s", line + 8);
			break;
		}
	}
	fclose(f);
}

static void new_region_is_locked(long step)
{
	char flags[512];
	char *p = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	zdtm_check(p != MAP_FAILED, "mmap");
	p[0] = 1;
	vm_flags_of(p, flags, sizeof(flags));
	zdtm_check(strstr(flags, " lo") && strstr(flags, " lf"),
		   "step %ld: a new region is not locked on fault (VmFlags:%s)", step, flags);
	munmap(p, REGION);
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	uint64_t hash = 0;

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(mlockall(MCL_FUTURE | MCL_ONFAULT) == 0, "mlockall: %s", strerror(errno));
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		new_region_is_locked(step);
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	zdtm_hold();
	new_region_is_locked(steps);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
