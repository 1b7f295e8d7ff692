/*
 * Reading the saved pages into place.  The cost of a restart is mostly the
 * kernel's: faulting in fresh pages and copying from the page cache.  A
 * large image is cut into pieces that every CPU reads (helpers.c).
 *
 * reader_prepare() runs before the point of no return; the rest after it,
 * with raw system calls only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include "restart.h"
#include "sys.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define PIECE (32UL << 20)		/* small enough to share out evenly */
#define PARALLEL_FROM (128UL << 20)	/* below this, helpers cost more than they save */

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
} plan;

/* Room for the pieces of every region of img. */
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

/* Read every piece added; the process is lost if one cannot be read. */
void reader_run(void)
{
	if (plan.bytes >= PARALLEL_FROM)
		helpers_run(read_pieces, NULL);
	else
		read_pieces(NULL);
	if (plan.error)
		fatal("reading page data", plan.error);
}
