/*
 * What a program tells the kernel about its memory: regions locked with
 * mlock() and mlock2(MLOCK_ONFAULT), and madvise()d DONTDUMP, DONTFORK,
 * WIPEONFORK, HUGEPAGE, NOHUGEPAGE, MERGEABLE, SEQUENTIAL, RANDOM.  At
 * every step each region must still show its flag in /proc/self/smaps and
 * hold its bytes; every 50 steps a forked child checks what fork does
 * with them (WIPEONFORK memory reads zeros, DONTFORK memory is gone).
 *
 *   mem_advice [steps] [ms-per-step] [forkable]
 *
 * forkable: without the DONTFORK and WIPEONFORK regions (which make a
 * checkpoint write in place), so a checkpoint's writer is a forked child,
 * which inherits no lock.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include "zdtm.h"

#ifndef MLOCK_ONFAULT
#define MLOCK_ONFAULT 1
#endif

#define PAGES 8

struct region {
	const char *name;
	const char *flag;	/* in smaps' VmFlags */
	int advice;		/* madvise(), or -1: mlock, -2: mlock2(MLOCK_ONFAULT) */
	int fork_unsafe;
	unsigned char *addr;
	int used;		/* the kernel here took the advice */
};

static struct region regions[] = {
	{ .name = "locked", .flag = "lo", .advice = -1, .fork_unsafe = 0 },
	{ .name = "locked on fault", .flag = "lf", .advice = -2, .fork_unsafe = 0 },
	{ .name = "dontdump", .flag = "dd", .advice = MADV_DONTDUMP, .fork_unsafe = 0 },
	{ .name = "dontfork", .flag = "dc", .advice = MADV_DONTFORK, .fork_unsafe = 1 },
	{ .name = "wipeonfork", .flag = "wf", .advice = MADV_WIPEONFORK, .fork_unsafe = 1 },
	{ .name = "hugepage", .flag = "hg", .advice = MADV_HUGEPAGE, .fork_unsafe = 0 },
	{ .name = "nohugepage", .flag = "nh", .advice = MADV_NOHUGEPAGE, .fork_unsafe = 0 },
	{ .name = "mergeable", .flag = "mg", .advice = MADV_MERGEABLE, .fork_unsafe = 0 },
	{ .name = "sequential", .flag = "sr", .advice = MADV_SEQUENTIAL, .fork_unsafe = 0 },
	{ .name = "random", .flag = "rr", .advice = MADV_RANDOM, .fork_unsafe = 0 },
};
#define NREGIONS (sizeof(regions) / sizeof(regions[0]))

static size_t region_size(void)
{
	return PAGES * 4096;
}

static unsigned char pattern(unsigned r, size_t i)
{
	return (unsigned char)(r * 37 + i * 11 + 1);
}

static void advise(struct region *r)
{
	int rc;

	if (r->advice == -1)
		rc = mlock(r->addr, region_size());
	else if (r->advice == -2)
		rc = mlock2(r->addr, region_size(), MLOCK_ONFAULT);
	else
		rc = madvise(r->addr, region_size(), r->advice);
	/* KSM or THP may be missing here: then the run has no such region */
	r->used = rc == 0;
	zdtm_check(rc == 0 || errno == EINVAL, "%s: %s", r->name, strerror(errno));
}

/* The VmFlags line of the region at addr, from /proc/self/smaps. */
static int region_flags(const void *addr, char *flags, size_t size)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[512];
	int in = 0, found = 0;

	zdtm_check(f != NULL, "smaps: %s", strerror(errno));
	while (!found && fgets(line, sizeof(line), f)) {
		unsigned long start, end;
		char dash;

		if (sscanf(line, "%lx%c%lx ", &start, &dash, &end) == 3 && dash == '-')
			in = (uintptr_t)addr >= start && (uintptr_t)addr < end;
		else if (in && !strncmp(line, "VmFlags:", 8)) {
			snprintf(flags, size, "%s", line + 8);
			found = 1;
		}
	}
	fclose(f);
	return found;
}

static int has_flag(const char *flags, const char *flag)
{
	for (const char *p = flags; (p = strstr(p, flag)); p++)
		if (p[-1] == ' ' && (p[2] == ' ' || p[2] == '\n' || p[2] == '\0'))
			return 1;
	return 0;
}

static void check_regions(long step)
{
	for (unsigned r = 0; r < NREGIONS; r++) {
		char flags[512];

		if (!regions[r].addr || !regions[r].used)
			continue;
		zdtm_check(region_flags(regions[r].addr, flags, sizeof(flags)),
			   "step %ld: %s region gone", step, regions[r].name);
		zdtm_check(has_flag(flags, regions[r].flag), "step %ld: %s region lost '%s':%s",
			   step, regions[r].name, regions[r].flag, flags);
		for (size_t i = 0; i < region_size(); i++)
			zdtm_check(regions[r].addr[i] == pattern(r, i), "step %ld: %s region: byte %zu",
				   step, regions[r].name, i);
	}
}

/* In a child: DONTFORK memory is not there, WIPEONFORK memory is zeros,
 * everything else is as in the parent. */
static int child_view(void)
{
	char flags[512];

	for (unsigned r = 0; r < NREGIONS; r++) {
		struct region *g = &regions[r];

		if (!g->addr || !g->used)
			continue;
		if (g->advice == MADV_DONTFORK) {
			if (region_flags(g->addr, flags, sizeof(flags)))
				return 10 + r;
		} else if (g->advice == MADV_WIPEONFORK) {
			for (size_t i = 0; i < region_size(); i++)
				if (g->addr[i])
					return 10 + r;
		} else if (g->addr[0] != pattern(r, 0)) {
			return 10 + r;
		}
	}
	return 0;
}

static void check_fork(long step)
{
	int status;
	pid_t pid = fork();

	zdtm_check(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0)
		_exit(child_view());
	zdtm_check(waitpid(pid, &status, 0) == pid, "waitpid: %s", strerror(errno));
	zdtm_check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		   "step %ld: a child saw region %d wrong after fork", step,
		   WIFEXITED(status) ? WEXITSTATUS(status) - 10 : -1);
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	int forkable = argc > 3 && !strcmp(argv[3], "forkable");
	uint64_t hash = 0;

	zdtm_args(argc, argv, &steps, &pace);
	for (unsigned r = 0; r < NREGIONS; r++) {
		if (forkable && regions[r].fork_unsafe)
			continue;
		regions[r].addr = mmap(NULL, region_size(), PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		zdtm_check(regions[r].addr != MAP_FAILED, "mmap: %s", strerror(errno));
		for (size_t i = 0; i < region_size(); i++)
			regions[r].addr[i] = pattern(r, i);
		advise(&regions[r]);
		hash = zdtm_mix(hash, regions[r].used);
	}
	printf("READY\n");
	fflush(stdout);
	for (long s = 1; s <= steps; s++) {
		check_regions(s);
		if (s % 50 == 0)
			check_fork(s);
		zdtm_pace(pace);
	}
	zdtm_hold();
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
