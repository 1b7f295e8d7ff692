/*
 * Scratch buffers of the checkpoint thread.  They are mmap'd for one
 * checkpoint (never malloc'd: a parked thread may hold the malloc lock) and
 * are not part of the image; the restart path forgets them.
 */
#include <sys/mman.h>
#include "shim.h"

#define MAX_SCRATCH 1024	/* a few per fd with a payload, a few per flushed connection */

static struct { uint64_t start, end; } ranges[MAX_SCRATCH];

void *scratch_map(size_t len)
{
	void *p = shim_mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	/* parked threads map some too (queued_signals.c), all at once:
	 * a slot is claimed by its end */
	for (int i = 0; i < MAX_SCRATCH; i++) {
		uint64_t free_slot = 0,
			 end = ((uint64_t)p + len + CKPT_PAGE_SIZE - 1) & ~(uint64_t)(CKPT_PAGE_SIZE - 1);

		if (!__atomic_compare_exchange_n(&ranges[i].end, &free_slot, end, 0,
						 __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
			continue;
		__atomic_store_n(&ranges[i].start, (uint64_t)p, __ATOMIC_RELEASE);
		return p;
	}
	shim_munmap(p, len);
	return NULL;
}

void scratch_unmap(void *p, size_t len)
{
	for (int i = 0; i < MAX_SCRATCH; i++)
		if (__atomic_load_n(&ranges[i].start, __ATOMIC_ACQUIRE) == (uint64_t)p) {
			ranges[i].start = 0;
			__atomic_store_n(&ranges[i].end, 0, __ATOMIC_RELEASE);
		}
	shim_munmap(p, len);
}

/*
 * The kernel merges adjacent anonymous mappings, so a scratch buffer (or
 * the reserved restart range) may
 * hide inside a larger region of /proc/self/maps.  For an address a this
 * says where the next piece to save ends (the next scratch buffer's
 * start), or, if a is inside a scratch buffer, returns 1 and where it ends.
 */
int scratch_at(uint64_t a, uint64_t *until)
{
	uint64_t next = UINT64_MAX;

	/* the restart range too: the kernel may merge it with a neighbour */
	if (a >= CKPT_RESERVE_START && a < CKPT_RESERVE_END) {
		*until = CKPT_RESERVE_END;
		return 1;
	}
	if (a < CKPT_RESERVE_START)
		next = CKPT_RESERVE_START;

	for (int i = 0; i < MAX_SCRATCH; i++) {
		if (!ranges[i].end)
			continue;
		if (a >= ranges[i].start && a < ranges[i].end) {
			*until = ranges[i].end;
			return 1;
		}
		if (ranges[i].start > a && ranges[i].start < next)
			next = ranges[i].start;
	}
	*until = next;
	return 0;
}

/* After a restart the buffers are gone: drop the bookkeeping. */
void scratch_forget(void)
{
	for (int i = 0; i < MAX_SCRATCH; i++)
		ranges[i].start = ranges[i].end = 0;
}
