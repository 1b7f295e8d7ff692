/*
 * Issue 37, shape 6: MAP_DROPPABLE memory (Linux 6.11), whose pages the
 * kernel may drop under memory pressure and which a child gets zeroed
 * (as MADV_WIPEONFORK).  A droppable region with written and unwritten
 * pages, split in two by mprotect, beside an ordinary private region.
 * At the end the droppable parts are still droppable ("dp" in the VmFlags
 * of /proc/self/smaps), the ordinary one is not, the contents are as
 * written, and a forked child sees the droppable pages zeroed.
 */
#define _GNU_SOURCE
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include "zdtm.h"

#ifndef MAP_DROPPABLE
#define MAP_DROPPABLE 0x08
#endif

#define PAGES 16
#define PAGE 4096

/* Whether the VmFlags of the region that holds addr name flag. */
static int has_vm_flag(const void *addr, const char *flag)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[512];
	unsigned long start, end, at = (unsigned long)addr;
	int inside = 0, found = -1;

	zdtm_check(f != NULL, "/proc/self/smaps: %m");
	while (found < 0 && fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%lx-%lx ", &start, &end) == 2 && strchr(line, '-') < strchr(line, ' '))
			inside = start <= at && at < end;
		else if (inside && !strncmp(line, "VmFlags:", 8)) {
			char *p = line + 8, *word;

			found = 0;
			while ((word = strtok(p, " \n"))) {
				p = NULL;
				if (!strcmp(word, flag))
					found = 1;
			}
		}
	}
	fclose(f);
	zdtm_check(found >= 0, "no region at %p in /proc/self/smaps", addr);
	return found;
}

static unsigned char pattern(long page, long i)
{
	return (unsigned char)(page * 31 + i * 7 + 1);
}

/* Written pages hold their pattern, the others zero. */
static uint64_t check_contents(const unsigned char *p, const char *what, uint64_t hash)
{
	for (long page = 0; page < PAGES; page++) {
		int written = page % 3 != 1;

		for (long i = 0; i < PAGE; i++) {
			unsigned char want = written ? pattern(page, i) : 0;

			zdtm_check(p[page * PAGE + i] == want, "%s: page %ld byte %ld is %u, expected %u",
				   what, page, i, p[page * PAGE + i], want);
		}
		hash = zdtm_mix(hash, written);
	}
	return hash;
}

static void fill(unsigned char *p)
{
	for (long page = 0; page < PAGES; page++)
		if (page % 3 != 1)
			for (long i = 0; i < PAGE; i++)
				p[page * PAGE + i] = pattern(page, i);
}

/* A child gets droppable memory zeroed, ordinary memory as it is. */
static void check_child_view(const unsigned char *drop, const unsigned char *plain)
{
	pid_t child = fork();
	int status;

	zdtm_check(child >= 0, "fork: %m");
	if (child == 0)
		_exit(drop[0] == 0 && drop[3 * PAGE] == 0 && plain[0] == pattern(0, 0) ? 0 : 1);
	zdtm_check(waitpid(child, &status, 0) == child && WIFEXITED(status) &&
		   WEXITSTATUS(status) == 0, "a child did not see the droppable memory zeroed");
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	uint64_t hash = 0;
	unsigned char *drop, *plain;

	zdtm_args(argc, argv, &steps, &pace);
	drop = mmap(NULL, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_DROPPABLE | MAP_ANONYMOUS, -1, 0);
	plain = mmap(NULL, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	zdtm_check(drop != MAP_FAILED && plain != MAP_FAILED, "mmap: %m");
	fill(drop);
	fill(plain);
	/* two regions of one droppable map: the upper half read-only */
	zdtm_check(mprotect(drop + PAGES / 2 * PAGE, PAGES / 2 * PAGE, PROT_READ) == 0, "mprotect: %m");
	zdtm_check(has_vm_flag(drop, "dp") && has_vm_flag(drop + PAGES / 2 * PAGE, "dp") &&
		   !has_vm_flag(plain, "dp"), "no \"dp\" in VmFlags before");
	printf("READY\n");
	fflush(stdout);
	hash = zdtm_steps_hash(hash, steps, pace);
	zdtm_hold();
	zdtm_check(has_vm_flag(drop, "dp"), "the droppable region is no longer droppable");
	zdtm_check(has_vm_flag(drop + PAGES / 2 * PAGE, "dp"),
		   "the read-only part of the droppable region is no longer droppable");
	zdtm_check(!has_vm_flag(plain, "dp"), "the ordinary region became droppable");
	hash = check_contents(drop, "droppable", hash);
	hash = check_contents(plain, "ordinary", hash);
	check_child_view(drop, plain);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
