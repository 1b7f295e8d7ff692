/*
 * Thousands of memory regions: 2,000 shared maps of pages of one file
 * (every other page, so none merge) and 2,000 private anonymous regions
 * of alternating protection.  Each step writes into one region of each
 * kind; the file is read back through pread, the anonymous memory
 * checked in place.  A restart must not need an fd per region.
 *
 *   many_maps [steps] [ms-per-step] [dir]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "zdtm.h"

#define NFILE 2000
#define NANON 2000
#define PAGE 4096L

static char *file_map[NFILE], *anon[NANON];

static void write_step(int fd, long s)
{
	long f = s % NFILE, a = (s * 7) % NANON;
	long value;

	*(long *)file_map[f] = s;
	zdtm_check(pread(fd, &value, sizeof(value), 2 * PAGE * f) == sizeof(value) && value == s,
		   "the file does not show region %ld's write", f);
	if (a % 2)	/* the read-only ones are checked, not written */
		*(long *)anon[a] = s;
}

static uint64_t all_contents(void)
{
	uint64_t h = 0;

	for (long i = 0; i < NFILE; i++)
		h = zdtm_mix(h, *(long *)file_map[i]);
	for (long i = 0; i < NANON; i++) {
		h = zdtm_mix(h, *(long *)anon[i]);
		h = zdtm_mix(h, (unsigned char)anon[i][PAGE - 1]);
	}
	return h;
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	const char *dir = argc > 3 ? argv[3] : ".";
	char path[4096];
	int fd;

	zdtm_args(argc, argv, &steps, &pace);
	snprintf(path, sizeof(path), "%s/many_maps.data", dir);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	zdtm_check(fd >= 0 && ftruncate(fd, 2 * PAGE * NFILE) == 0, "data file");
	for (long i = 0; i < NFILE; i++) {
		file_map[i] = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 2 * PAGE * i);
		zdtm_check(file_map[i] != MAP_FAILED, "mmap of the file");
	}
	for (long i = 0; i < NANON; i++) {
		anon[i] = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		zdtm_check(anon[i] != MAP_FAILED, "mmap");
		anon[i][PAGE - 1] = (char)i;
		if (i % 2 == 0)
			zdtm_check(mprotect(anon[i], PAGE, PROT_READ) == 0, "mprotect");
	}
	printf("READY\n");
	fflush(stdout);
	for (long s = 1; s <= steps; s++) {
		write_step(fd, s);
		zdtm_pace(pace);
	}
	zdtm_hold();
	for (long i = 0; i < NANON; i += 2)
		zdtm_check(anon[i][PAGE - 1] == (char)i, "read-only region %ld changed", i);
	zdtm_pass("%d regions, contents %016llx", NFILE + NANON,
		  (unsigned long long)all_contents());
	return 0;
}
