/*
 * Kernel AIO contexts (io_setup).  A context is the ring the kernel maps
 * into the process, named by the ring's address: the checkpoint saves the
 * ring's pages (native/shim/state/memory.c, CKPT_VMA_AIO_RING).  At restart
 * a context is made again with a ring of the same size, moved where the
 * old one was (the kernel follows a moved ring), and given back the
 * completed events nobody had taken.  The kernel keeps its own copy of the
 * ring's tail, which only completions move: it is brought to the saved
 * tail by as many empty reads of /dev/null, submitted and reaped.
 * Requests still in flight at the checkpoint (the shim noted them,
 * native/shim/state/aio.c) are submitted again from their iocbs in the
 * restored memory, once everything else is back.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "restart.h"
#include "sys.h"

struct aio_ring_header {		/* the kernel's struct aio_ring */
	uint32_t id;			/* its index in the process's table */
	uint32_t nr;			/* events the ring holds */
	uint32_t head, tail;
	uint32_t magic;
	uint32_t compat_features, incompat_features;
	uint32_t header_length;
};

#define EMPTY_READS_BATCH 32

/* What io_setup() is asked for so that its ring has this many pages: the
 * kernel doubles the request (at least 4 per possible CPU) and adds 2. */
static long ring_request(uint64_t len)
{
	uint64_t events = len / CKPT_PAGE_SIZE * (CKPT_PAGE_SIZE / sizeof(struct io_event));

	return (long)(events - 3) / 2;
}

/* How many events a ring of this many bytes holds, as the kernel counts. */
static uint32_t ring_events(uint64_t len)
{
	return (len - sizeof(struct aio_ring_header)) / sizeof(struct io_event);
}

static const struct loaded_vma *ring_at(const struct image *img, uint64_t ctx)
{
	for (unsigned i = 0; i < img->nvmas; i++)
		if (img->vmas[i].v.kind == CKPT_VMA_AIO_RING && img->vmas[i].v.start == ctx)
			return &img->vmas[i];
	return NULL;
}

static int in_some_region(const struct image *img, uint64_t addr, uint64_t len)
{
	for (unsigned i = 0; i < img->nvmas; i++)
		if (addr >= img->vmas[i].v.start && addr + len <= img->vmas[i].v.end &&
		    addr + len > addr)
			return 1;
	return 0;
}

/* Every request in flight names a saved ring and an iocb in memory. */
static void check_requests(const struct image *img)
{
	for (unsigned i = 0; i < img->naio_requests; i++) {
		const struct ckpt_aio_request *q = &img->aio_requests[i];

		if (!ring_at(img, q->ctx) || q->iocb % 8 ||
		    !in_some_region(img, q->iocb, sizeof(struct iocb)))
			die("%s: corrupt record of AIO requests (context %#llx, iocb %#llx)",
			    img->file, (unsigned long long)q->ctx, (unsigned long long)q->iocb);
	}
}

/* Before the point of no return: the saved rings, checked, and whether this
 * kernel makes rings of their size (it does not with many more CPUs). */
void aio_read_rings(struct image *img)
{
	check_requests(img);
	for (unsigned i = 0; i < img->nvmas; i++) {
		struct loaded_vma *lv = &img->vmas[i];
		uint64_t len = lv->v.end - lv->v.start;
		const struct aio_ring_header *saved;
		aio_context_t ctx = 0;
		uint32_t nr;

		if (lv->v.kind != CKPT_VMA_AIO_RING)
			continue;
		lv->aio_ring = arena_alloc(len);
		memset(lv->aio_ring, 0, len);
		read_region_at(img, lv, lv->aio_ring);
		saved = (const void *)lv->aio_ring;
		if (saved->nr != ring_events(len) || saved->head >= saved->nr ||
		    saved->tail >= saved->nr)
			die("%s: corrupt AIO ring at %#llx", img->file,
			    (unsigned long long)lv->v.start);
		if (syscall(SYS_io_setup, ring_request(len), &ctx))
			die("pid %d: cannot make its AIO context again (io_setup of %ld events): %s",
			    img->hdr.pid, ring_request(len), strerror(errno));
		nr = ((const struct aio_ring_header *)ctx)->nr;
		syscall(SYS_io_destroy, ctx);
		if (nr != saved->nr)
			die("pid %d: this host makes AIO rings of %u events where the checkpoint's "
			    "had %u (more CPUs): the context cannot be made again", img->hdr.pid,
			    nr, saved->nr);
	}
}

/* The kernel's own tail moved by n completions: empty reads, reaped. */
static void advance_tail(aio_context_t ctx, uint32_t n)
{
	struct iocb cbs[EMPTY_READS_BATCH], *ptrs[EMPTY_READS_BATCH];
	struct io_event events[EMPTY_READS_BATCH];
	long fd = sys4(SYS_openat, AT_FDCWD, "/dev/null", O_RDONLY | O_CLOEXEC, 0);
	char byte;

	if (fd < 0)
		fatal("opening /dev/null for an AIO context", fd);
	while (n) {
		uint32_t k = n < EMPTY_READS_BATCH ? n : EMPTY_READS_BATCH;
		long r;

		for (uint32_t i = 0; i < k; i++) {
			memset(&cbs[i], 0, sizeof(cbs[i]));
			cbs[i].aio_lio_opcode = IOCB_CMD_PREAD;
			cbs[i].aio_fildes = fd;
			cbs[i].aio_buf = (uint64_t)(uintptr_t)&byte;
			ptrs[i] = &cbs[i];
		}
		r = sys3(SYS_io_submit, ctx, k, ptrs);
		if (r != (long)k)
			fatal("moving an AIO context's tail (io_submit)", r < 0 ? r : -EAGAIN);
		r = sys5(SYS_io_getevents, ctx, k, k, events, NULL);
		if (r != (long)k)
			fatal("moving an AIO context's tail (io_getevents)", r < 0 ? r : -EAGAIN);
		n -= k;
	}
	sys1(SYS_close, fd);
}

/* After the point of no return, in map_region's order. */
void aio_restore_ring(const struct loaded_vma *lv)
{
	const struct aio_ring_header *saved = (const void *)lv->aio_ring;
	uint64_t start = lv->v.start, len = lv->v.end - start;
	struct aio_ring_header *ring;
	aio_context_t ctx = 0;
	long r;

	/* held, so that the new ring is not put across it */
	r = sys6(SYS_mmap, start, len, PROT_NONE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
	if (r < 0)
		fatal("holding an AIO ring's place", r);
	r = sys2(SYS_io_setup, ring_request(len), &ctx);
	if (r < 0)
		fatal("making an AIO context again (io_setup)", r);
	ring = (struct aio_ring_header *)ctx;
	if (ring->nr != saved->nr)
		fatal("making an AIO context again: the ring has another size", -EINVAL);
	advance_tail(ctx, saved->tail);
	memcpy(ring + 1, saved + 1, len - sizeof(*ring));	/* the events */
	ring->head = saved->head;
	r = sys5(SYS_mremap, ctx, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, start);
	if (r < 0 || (uint64_t)r != start)
		fatal("moving an AIO ring back", r < 0 ? r : -EFAULT);
}

/* Whether the ring at ctx holds a completion of iocb not yet reaped. */
static int completed(aio_context_t ctx, uint64_t iocb)
{
	const struct aio_ring_header *ring = (const void *)ctx;
	const struct io_event *events = (const void *)(ring + 1);

	for (uint32_t i = ring->head; i != ring->tail; i = (i + 1) % ring->nr)
		if (events[i].obj == iocb)
			return 1;
	return 0;
}

/* Last, with memory and fds back: the requests in flight at the checkpoint
 * whose completion the ring does not hold, submitted again. */
void aio_submit_again(const struct image *img)
{
	for (unsigned i = 0; i < img->naio_requests; i++) {
		const struct ckpt_aio_request *q = &img->aio_requests[i];
		struct iocb *cb = (struct iocb *)(uintptr_t)q->iocb;
		long r;

		if (completed(q->ctx, q->iocb))
			continue;
		r = sys3(SYS_io_submit, q->ctx, 1, &cb);
		if (r != 1)
			fatal("submitting an AIO request in flight again (io_submit)",
			      r < 0 ? r : -EAGAIN);
	}
}
