/*
 * Scratch buffers of the checkpoint thread.  They are mmap'd for one
 * checkpoint (never malloc'd: a parked thread may hold the malloc lock) and
 * are not part of the image; the restart path forgets them.
 */
#include <sys/mman.h>
#include "shim.h"

#define MAX_SCRATCH 8

static struct { uint64_t start, end; } ranges[MAX_SCRATCH];

void *scratch_map(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	for (int i = 0; i < MAX_SCRATCH; i++) {
		if (ranges[i].end)
			continue;
		ranges[i].start = (uint64_t)p;
		ranges[i].end = (uint64_t)p + len;
		return p;
	}
	munmap(p, len);
	return NULL;
}

void scratch_unmap(void *p, size_t len)
{
	for (int i = 0; i < MAX_SCRATCH; i++)
		if (ranges[i].start == (uint64_t)p)
			ranges[i].start = ranges[i].end = 0;
	munmap(p, len);
}

/* Does [start, end) lie inside a scratch buffer? */
int scratch_contains(uint64_t start, uint64_t end)
{
	for (int i = 0; i < MAX_SCRATCH; i++)
		if (ranges[i].end && start >= ranges[i].start && end <= ranges[i].end)
			return 1;
	return 0;
}

/* After a restart the buffers are gone: drop the bookkeeping. */
void scratch_forget(void)
{
	for (int i = 0; i < MAX_SCRATCH; i++)
		ranges[i].start = ranges[i].end = 0;
}
