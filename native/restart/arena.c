/* Memory of ckpt-restart: a bump allocator and thread stacks, both inside
 * the reserved range so that unmapping the old address space spares them. */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include "restart.h"

static char *arena_next;
static char *arena_end;

int arena_init(void)
{
	void *p = mmap((void *)ZONE_ARENA, ZONE_ARENA_SIZE, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
		       -1, 0);

	if (p == MAP_FAILED)
		return errno;
	arena_next = p;
	arena_end = arena_next + ZONE_ARENA_SIZE;
	return 0;
}

void *arena_alloc(size_t size)
{
	char *p = arena_next;

	size = (size + 63) & ~(size_t)63;
	if (size > (size_t)(arena_end - arena_next))
		die("out of memory for the image's metadata");
	arena_next += size;
	return p;
}

void *zone_stack(unsigned index)
{
	char *base = (char *)ZONE_STACKS + (size_t)index * ZONE_STACK_SIZE;
	void *p;

	if (index >= ZONE_MAX_STACKS)
		return NULL;
	p = mmap(base, ZONE_STACK_SIZE, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	return base + ZONE_STACK_SIZE;
}
