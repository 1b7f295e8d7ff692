/*
 * What mlock() and madvise() told the kernel about each region, read from
 * the VmFlags of /proc/self/smaps while the process is stopped, for the
 * image (struct ckpt_vma.advice); restart/memory.c gives it again.  And
 * whether mlockall(MCL_FUTURE) locks regions yet to come
 * (ckpt_process.future_locks; restart/memory.c, relock_memory).
 *
 * Read in the process itself, before a forked writer exists: a child
 * does not inherit mlock, and MADV_DONTFORK and MADV_WIPEONFORK memory
 * is missing or zero there (such memory rules the forked write out).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "shim.h"

#define CHUNK (256 << 10)

struct vma_advice {
	uint64_t start, end;
	uint32_t bits;
};

struct vma_advice_table {
	struct vma_advice *v;
	size_t n, cap;
	size_t bytes;		/* of the scratch mapping that holds us */
	int unforkable;
	uint32_t future;	/* mlockall(MCL_FUTURE): what a new region gets */
};

static const struct {
	char name[3];
	uint32_t bit;
} vm_flags[] = {
	{ "lo", CKPT_ADVICE_LOCKED }, { "lf", CKPT_ADVICE_LOCKONFAULT },
	{ "dd", CKPT_ADVICE_DONTDUMP }, { "dc", CKPT_ADVICE_DONTFORK },
	{ "wf", CKPT_ADVICE_WIPEONFORK }, { "hg", CKPT_ADVICE_HUGEPAGE },
	{ "nh", CKPT_ADVICE_NOHUGEPAGE }, { "mg", CKPT_ADVICE_MERGEABLE },
	{ "sr", CKPT_ADVICE_SEQUENTIAL }, { "rr", CKPT_ADVICE_RANDOM },
	{ "dp", CKPT_ADVICE_DROPPABLE },
};

/* "VmFlags: rd wr mr mw me ac lo" -> CKPT_ADVICE_* */
static uint32_t parse_vm_flags(const char *p)
{
	uint32_t bits = 0;

	while (*p) {
		while (*p == ' ')
			p++;
		for (size_t i = 0; i < sizeof(vm_flags) / sizeof(vm_flags[0]); i++)
			if (p[0] == vm_flags[i].name[0] && p[1] == vm_flags[i].name[1] &&
			    (p[2] == ' ' || p[2] == '\0'))
				bits |= vm_flags[i].bit;
		while (*p && *p != ' ')
			p++;
	}
	return bits;
}

/* "start-end perms ..." starts a region; "Name: value" lines follow. */
static int parse_range(const char *line, uint64_t *start, uint64_t *end)
{
	char *dash, *space;
	uint64_t s = strtoull(line, &dash, 16), e;

	if (dash == line || *dash != '-')	/* "AnonHugePages:" starts with hex */
		return 0;
	e = strtoull(dash + 1, &space, 16);
	if (*space != ' ')
		return 0;
	*start = s;
	*end = e;
	return 1;
}

static int table_grow(struct vma_advice_table **t)
{
	size_t cap = (*t)->cap ? (*t)->cap * 2 : 256;
	size_t bytes = sizeof(**t) + cap * sizeof(struct vma_advice);
	struct vma_advice_table *bigger = scratch_map(bytes);

	if (!bigger)
		return ENOMEM;
	*bigger = **t;
	bigger->v = (struct vma_advice *)(bigger + 1);
	memcpy(bigger->v, (*t)->v, (*t)->n * sizeof(struct vma_advice));
	bigger->cap = cap;
	bigger->bytes = bytes;
	scratch_unmap(*t, (*t)->bytes);
	*t = bigger;
	return 0;
}

static int add_line(struct vma_advice_table **t, const char *line, uint64_t *start,
		    uint64_t *end)
{
	uint32_t bits;

	if (parse_range(line, start, end) || strncmp(line, "VmFlags:", 8))
		return 0;
	bits = parse_vm_flags(line + 8);
	if (bits & (CKPT_ADVICE_DONTFORK | CKPT_ADVICE_WIPEONFORK))
		(*t)->unforkable = 1;
	if (!bits)
		return 0;
	if ((*t)->n == (*t)->cap && table_grow(t))
		return ENOMEM;
	(*t)->v[(*t)->n++] = (struct vma_advice){ *start, *end, bits };
	return 0;
}

/* Line by line, in chunks: smaps of a process with many regions is large. */
static int read_smaps(int fd, struct vma_advice_table **t)
{
	char *buf = scratch_map(CHUNK + 1);
	uint64_t start = 0, end = 0;
	size_t have = 0;
	int err = buf ? 0 : ENOMEM;

	while (!err) {
		ssize_t got = read(fd, buf + have, CHUNK - have);
		char *line = buf, *nl;

		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0) {
			err = got < 0 ? errno : 0;
			break;
		}
		have += got;
		buf[have] = '\0';
		while (!err && (nl = strchr(line, '\n'))) {
			*nl = '\0';
			err = add_line(t, line, &start, &end);
			line = nl + 1;
		}
		have -= line - buf;
		memmove(buf, line, have);
		if (have == CHUNK)	/* no line is that long */
			err = EIO;
	}
	if (buf)
		scratch_unmap(buf, CHUNK + 1);
	return err;
}

struct vma_advice_table *vma_advice_read(int *err)
{
	struct vma_advice_table *t = scratch_map(sizeof(*t));
	/* a new region shows what mlockall(MCL_FUTURE) left for new ones
	 * (no file tells): PROT_NONE, so that nothing is faulted in */
	void *probe = shim_mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int fd;

	*err = ENOMEM;
	if (!t || probe == MAP_FAILED)
		goto fail;
	memset(t, 0, sizeof(*t));
	t->bytes = sizeof(*t);
	fd = open("/proc/self/smaps", O_RDONLY | O_CLOEXEC);
	*err = fd < 0 ? errno : read_smaps(fd, &t);
	if (fd >= 0)
		close(fd);
	if (*err)
		goto fail;
	t->future = vma_advice_at(t, (uint64_t)probe) &
		    (CKPT_ADVICE_LOCKED | CKPT_ADVICE_LOCKONFAULT);
	shim_munmap(probe, 4096);
	return t;
fail:
	if (probe != MAP_FAILED)
		shim_munmap(probe, 4096);
	if (t)
		vma_advice_free(t);
	return NULL;
}

uint32_t vma_advice_future(const struct vma_advice_table *t)
{
	return t->future;
}

uint32_t vma_advice_at(const struct vma_advice_table *t, uint64_t addr)
{
	size_t lo = 0, hi = t ? t->n : 0;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (addr < t->v[mid].start)
			hi = mid;
		else if (addr >= t->v[mid].end)
			lo = mid + 1;
		else
			return t->v[mid].bits;
	}
	return 0;
}

int vma_advice_unforkable(const struct vma_advice_table *t)
{
	return t->unforkable;
}

void vma_advice_free(struct vma_advice_table *t)
{
	if (t)
		scratch_unmap(t, t->bytes);
}
