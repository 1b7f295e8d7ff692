/*
 * Reading the saved pages into place, on every CPU the restart may use.
 *
 * The cost of a restart is mostly the kernel's: faulting in fresh pages
 * and copying from the page cache.  One reader leaves the other cores
 * idle, so a large image is cut into pieces that helper tasks read too.
 *
 * The helpers share the address space and fd table (CLONE_VM|CLONE_FILES)
 * but are processes, not threads: each is waited for, so its pid is free
 * again before the job's own threads come back.  Their pids, chosen with
 * clone3's set_tid from the top of the pid range, are none of the job's.
 *
 * reader_prepare() runs before the point of no return; the rest after it,
 * with raw system calls only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "restart.h"
#include "sys.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define PIECE (32UL << 20)		/* small enough to share out evenly */
#define PARALLEL_FROM (128UL << 20)	/* below this, helpers cost more than they save */
#define MAX_HELPERS 7
#define PID_CANDIDATES 64

struct piece {
	uint64_t addr, len, off;
};

static struct {
	int fd;
	struct piece *pieces;
	unsigned npieces, max_pieces;
	uint64_t bytes;
	unsigned next;			/* the next piece to take (atomic) */
	long error;			/* the first failed read (atomic) */
	unsigned helpers;
	void *stack_top[MAX_HELPERS];
	pid_t candidates[PID_CANDIDATES];
	unsigned ncandidates;
} plan;

static unsigned cpus_available(void)
{
	cpu_set_t set;

	if (sched_getaffinity(0, sizeof(set), &set))
		return 1;
	return CPU_COUNT(&set);
}

static long pid_max(void)
{
	char buf[32] = "";
	int fd = open("/proc/sys/kernel/pid_max", O_RDONLY | O_CLOEXEC);
	long n;

	if (fd < 0)
		return 32768;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	return n > 0 ? atol(buf) : 32768;
}

static void pick_helper_pids(void)
{
	for (long pid = pid_max() - 1; pid > 300 && plan.ncandidates < PID_CANDIDATES; pid--)
		if (!tree_pid_taken(pid))
			plan.candidates[plan.ncandidates++] = pid;
}

/* Room for the pieces of every region of img, and helpers to read them. */
void reader_prepare(struct image *img)
{
	unsigned max = 0;

	for (unsigned i = 0; i < img->nvmas; i++) {
		const struct loaded_vma *lv = &img->vmas[i];

		max += lv->v.nruns;
		for (unsigned r = 0; r < lv->v.nruns; r++)
			max += lv->runs[r].npages * CKPT_PAGE_SIZE / PIECE;
	}
	plan.fd = img->fd;
	plan.max_pieces = max;
	plan.pieces = arena_alloc((max + 1) * sizeof(*plan.pieces));
	plan.helpers = cpus_available() - 1;
	if (plan.helpers > MAX_HELPERS)
		plan.helpers = MAX_HELPERS;
	for (unsigned i = 0; i < plan.helpers; i++)
		if (!(plan.stack_top[i] = zone_stack(ZONE_MAX_STACKS - 1 - i)))
			plan.helpers = i;
	pick_helper_pids();
}

/* The pages at off in the image belong at addr. */
void reader_add(uint64_t addr, uint64_t len, uint64_t off)
{
	while (len) {
		uint64_t n = len > PIECE ? PIECE : len;

		if (plan.npieces == plan.max_pieces)
			fatal("more page data than the image's runs", -EOVERFLOW);
		plan.pieces[plan.npieces++] = (struct piece){ addr, n, off };
		plan.bytes += n;
		addr += n;
		off += n;
		len -= n;
	}
}

static long read_piece(const struct piece *p)
{
	uint64_t addr = p->addr, len = p->len, off = p->off;

	sys3(SYS_madvise, addr, len, MADV_POPULATE_WRITE);	/* batch the faults */
	while (len) {
		long n = sys4(SYS_pread64, plan.fd, addr, len, off);

		if (n == -EINTR)
			continue;
		if (n <= 0)
			return n ? n : -EIO;
		addr += n;
		off += n;
		len -= n;
	}
	return 0;
}

static int read_pieces(void *unused)
{
	(void)unused;
	for (;;) {
		unsigned i = __atomic_fetch_add(&plan.next, 1, __ATOMIC_RELAXED);
		long err;

		if (i >= plan.npieces || __atomic_load_n(&plan.error, __ATOMIC_RELAXED))
			return 0;
		err = read_piece(&plan.pieces[i]);
		if (err) {
			__atomic_store_n(&plan.error, err, __ATOMIC_RELAXED);
			return 0;
		}
	}
}

/* A helper on a stack of its own, with one of the free pids; 0 if none. */
static pid_t start_helper(unsigned index)
{
	void *stack_top = plan.stack_top[index];
	struct clone_args ca;

	while (plan.ncandidates) {
		pid_t pid = plan.candidates[--plan.ncandidates];
		long r;

		memset(&ca, 0, sizeof(ca));
		ca.flags = CLONE_VM | CLONE_FILES | CLONE_FS;
		ca.stack = (uint64_t)stack_top - ZONE_STACK_SIZE;
		ca.stack_size = ZONE_STACK_SIZE;
		ca.set_tid = (uint64_t)&pid;
		ca.set_tid_size = 1;
		r = clone3_run(&ca, sizeof(ca), read_pieces, NULL);
		if (r > 0)
			return r;
		if (r != -EEXIST)	/* another restored process's helper has it */
			return 0;
	}
	return 0;
}

/* Read every piece added; the process is lost if one cannot be read. */
void reader_run(void)
{
	pid_t helper[MAX_HELPERS];
	unsigned started = 0;

	if (plan.bytes >= PARALLEL_FROM)
		for (unsigned i = 0; i < plan.helpers; i++)
			if ((helper[started] = start_helper(i)) > 0)
				started++;
	read_pieces(NULL);
	for (unsigned i = 0; i < started; i++)
		while (sys4(SYS_wait4, helper[i], 0, __WALL, 0) == -EINTR)
			;
	if (plan.error)
		fatal("reading page data", plan.error);
}
