/*
 * Shared memory as it was when the job stopped, for a forked writer.
 *
 * A copy-on-write child sees private memory frozen at fork time, but
 * shared memory (MPI segments in /dev/shm, System V segments, shared
 * anonymous maps) keeps changing once the job resumes.  So while the job
 * is still stopped the parent copies the shared memory it is to save into
 * scratch buffers the child inherits, and the child writes the copies.
 * Only pages some process touched are copied: reading a hole of shared
 * memory would allocate it.  A kernel AIO ring, which the kernel writes
 * as requests complete, is copied the same way.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>
#include "shim.h"

#define MAX_WINDOWS 4096
#define MEMINFO_MAX 8192

struct shm_snapshot {
	unsigned n;
	uint64_t bytes;			/* copied so far */
	uint64_t limit;			/* at most this much */
	unsigned char *in_core;		/* mincore vector of one window */
	size_t in_core_size;
	struct shm_window w[MAX_WINDOWS];
};

/* Copies may take at most half of the memory the kernel says is available. */
static uint64_t copy_limit(void)
{
	char buf[MEMINFO_MAX];
	ssize_t n = ckpt_read_file("/proc/meminfo", buf, sizeof(buf) - 1);
	char *line;

	if (n <= 0)
		return 0;
	buf[n] = '\0';
	line = strstr(buf, "MemAvailable:");
	return line ? strtoull(line + 13, NULL, 10) * 1024 / 2 : 0;
}

struct shm_snapshot *shm_snapshot_new(size_t max_window)
{
	struct shm_snapshot *set = scratch_map(sizeof(*set));

	if (!set)
		return NULL;
	set->in_core_size = max_window / CKPT_PAGE_SIZE;
	set->in_core = scratch_map(set->in_core_size);
	set->limit = copy_limit();
	if (!set->in_core) {
		scratch_unmap(set, sizeof(*set));
		return NULL;
	}
	return set;
}

/* [addr, addr + len) into dst; a page that cannot be read (the object
 * shrank meanwhile) stays zero, as an in-place write would save it. */
static void copy_range(char *dst, uint64_t addr, size_t len)
{
	struct iovec local = { dst, len }, remote = { (void *)addr, len };

	if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)len)
		return;
	for (size_t off = 0; off < len; off += CKPT_PAGE_SIZE) {
		local = (struct iovec){ dst + off, CKPT_PAGE_SIZE };
		remote = (struct iovec){ (void *)(addr + off), CKPT_PAGE_SIZE };
		process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
	}
}

static int copy_touched(struct shm_snapshot *set, char *dst, uint64_t start, uint64_t end)
{
	size_t npages = (end - start) / CKPT_PAGE_SIZE;

	if (npages > set->in_core_size)
		return E2BIG;
	if (mincore((void *)start, end - start, set->in_core))
		return errno;
	for (size_t i = 0, j; i < npages; i = j) {
		for (j = i; j < npages && (set->in_core[j] & 1); j++)
			;
		if (j == i) {
			j++;
			continue;
		}
		set->bytes += (j - i) * CKPT_PAGE_SIZE;
		if (set->bytes > set->limit)
			return ENOMEM;
		copy_range(dst + i * CKPT_PAGE_SIZE, start + i * CKPT_PAGE_SIZE,
			   (j - i) * CKPT_PAGE_SIZE);
	}
	return 0;
}

/*
 * One window of shared memory: elsewhere, another process saves it; else
 * its touched pages are copied now (a region without PROT_READ is left to
 * the child, which reads it live).  ENOMEM or E2BIG: too much to copy.
 */
int shm_snapshot_add(struct shm_snapshot *set, uint64_t start, uint64_t end, int elsewhere,
		     int readable)
{
	struct shm_window *w;
	int err;

	if (set->n == MAX_WINDOWS)
		return E2BIG;
	w = &set->w[set->n];
	*w = (struct shm_window){ .start = start, .end = end, .elsewhere = elsewhere };
	if (!elsewhere && readable) {
		w->copy = scratch_map(end - start);
		if (!w->copy)
			return ENOMEM;
		err = copy_touched(set, w->copy, start, end);
		if (err) {
			scratch_unmap(w->copy, end - start);
			return err;
		}
	}
	set->n++;
	return 0;
}

const struct shm_window *shm_snapshot_find(const struct shm_snapshot *set, uint64_t start,
					   uint64_t end)
{
	for (unsigned i = 0; set && i < set->n; i++)
		if (set->w[i].start == start && set->w[i].end == end)
			return &set->w[i];
	return NULL;
}

uint64_t shm_snapshot_bytes(const struct shm_snapshot *set)
{
	return set ? set->bytes : 0;
}

/* In the parent once the child has its own copy, or after a failure. */
void shm_snapshot_free(struct shm_snapshot *set)
{
	if (!set)
		return;
	for (unsigned i = 0; i < set->n; i++)
		if (set->w[i].copy)
			scratch_unmap(set->w[i].copy, set->w[i].end - set->w[i].start);
	scratch_unmap(set->in_core, set->in_core_size);
	scratch_unmap(set, sizeof(*set));
}
