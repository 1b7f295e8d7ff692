/*
 * A program that reads its own /proc/self/maps a little at a time, as a
 * memory profiler or a garbage collector walking its heap does: 100 bytes
 * a step, so checkpoints land in the middle of a listing.  Each listing
 * read across a checkpoint must still be whole lines of its memory map,
 * in address order, with the region it made at the start among them.
 *
 *   maps_reader [steps] [ms-per-step]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include "zdtm.h"

#define LISTING_MAX (256 * 1024)

static char listing[LISTING_MAX];
static size_t listing_len;

/* Whole lines, each "start-end perms ...", starts rising; marker among them. */
static void check_listing(long step, const void *marker)
{
	unsigned long last_end = 0, start, end;
	int found = 0;
	char *line = listing;

	zdtm_check(listing_len && listing[listing_len - 1] == '\n',
		   "step %ld: the listing does not end with a whole line", step);
	listing[listing_len - 1] = '\0';
	for (char *next; line; line = next) {
		char perms[5];

		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		zdtm_check(sscanf(line, "%lx-%lx %4s", &start, &end, perms) == 3 && start < end,
			   "step %ld: not a line of a memory map: '%.80s'", step, line);
		zdtm_check(start >= last_end, "step %ld: %lx-%lx after %lx: lines out of order",
			   step, start, end, last_end);
		last_end = end;
		found |= start == (unsigned long)marker;
	}
	zdtm_check(found, "step %ld: the marker region %p is not in the listing", step, marker);
	listing_len = 0;
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	uint64_t hash = 0;
	void *marker;
	int fd;

	zdtm_args(argc, argv, &steps, &pace);
	marker = mmap(NULL, 7 * 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	zdtm_check(marker != MAP_FAILED, "mmap: %m");
	fd = open("/proc/self/maps", O_RDONLY);
	zdtm_check(fd >= 0, "open /proc/self/maps: %m");
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		ssize_t n = read(fd, listing + listing_len, 100);

		zdtm_check(n >= 0 && listing_len + n < LISTING_MAX, "step %ld: read: %zd %m",
			   step, n);
		listing_len += n;
		if (n == 0) {		/* the end of one listing: read it again */
			check_listing(step, marker);
			zdtm_check(lseek(fd, 0, SEEK_SET) == 0, "step %ld: lseek: %m", step);
		}
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	zdtm_hold();
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
