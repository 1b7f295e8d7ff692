/*
 * Compressed page data (--compress zstd|auto, ckpt_image.h): a memory
 * record's bytes are cut into CKPT_CHUNK_SIZE chunks, each compressed on
 * its own (one zstd frame with its size and checksum, or raw when it does
 * not shrink), by every CPU at once, then written in order.  A record's
 * header holds its chunks' sizes, so its chunks are written only once all
 * are compressed: while the next record's are (two banks of chunks), or
 * before anything else is written.
 *
 * The writer may be a bare clone of a process whose parked threads hold
 * locks (malloc's among them): no malloc here.  The workers are
 * cpu_tasks.c's and the zstd contexts live in static workspaces of
 * scratch memory.  `auto` compresses a few samples of
 * a record first and stores it raw when they do not shrink, so memory that
 * does not compress costs a few samples, not a pass over it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#define ZSTD_STATIC_LINKING_ONLY
#define ZSTD_DISABLE_DEPRECATE_WARNINGS	/* ZSTD_compress_advanced: static contexts */
#include <zstd.h>
#include "shim.h"

#define MAX_WORKERS 8
#define LEVEL 1				/* zstd -1: fast, most of the gain */
#define SAMPLES 4			/* auto: pieces looked at per record */
#define SAMPLE_SIZE (64 << 10)
#define WORTH(raw, packed) ((packed) <= (raw) - (raw) / 8)	/* saves 1/8 or more */

struct worker {
	ZSTD_CCtx *cctx;
	void *workspace;
	char *gather;			/* the chunk's bytes, contiguous */
};

/* A record's chunks */
struct bank {
	char *slots;			/* a compressBound-sized slot per chunk */
	struct ckpt_chunk *table;
	uint64_t nchunks;
};

struct compressor {
	int mode;			/* CKPT_COMPRESSION_* */
	struct cpu_tasks *tasks;
	unsigned nworkers;
	size_t workspace_size, slot_size, max_chunks;
	struct worker wk[MAX_WORKERS];
	struct bank banks[2];
	struct bank *fill;		/* the record being compressed */
	struct bank *queued;		/* a record's chunks not yet written, or NULL */
	struct image_writer *w;
	int write_error;
	/* the record being compressed */
	uint64_t data_size;
	compress_gather_fn gather;
	void *ctx;
	unsigned next, joined;		/* atomic */
	int error;			/* atomic */
};

static int worker_init(struct compressor *c, struct worker *wk)
{
	wk->workspace = scratch_map(c->workspace_size);
	wk->gather = scratch_map(CKPT_CHUNK_SIZE);
	if (!wk->workspace || !wk->gather)
		return ENOMEM;
	wk->cctx = ZSTD_initStaticCCtx(wk->workspace, c->workspace_size);
	return wk->cctx ? 0 : EINVAL;
}

static void worker_free(struct compressor *c, struct worker *wk)
{
	if (wk->workspace)
		scratch_unmap(wk->workspace, c->workspace_size);
	if (wk->gather)
		scratch_unmap(wk->gather, CKPT_CHUNK_SIZE);
}

static int bank_init(struct compressor *c, struct bank *b)
{
	b->slots = scratch_map(c->slot_size * c->max_chunks);
	b->table = scratch_map(sizeof(struct ckpt_chunk) * c->max_chunks);
	return b->slots && b->table ? 0 : ENOMEM;
}

static void bank_free(struct compressor *c, struct bank *b)
{
	if (b->slots)
		scratch_unmap(b->slots, c->slot_size * c->max_chunks);
	if (b->table)
		scratch_unmap(b->table, sizeof(struct ckpt_chunk) * c->max_chunks);
}

/* For records of up to max_bytes of page data; NULL when mode is none. */
struct compressor *compressor_new(int mode, uint64_t max_bytes, int *err)
{
	struct compressor *c;

	*err = 0;
	if (mode == CKPT_COMPRESSION_NONE)
		return NULL;
	c = scratch_map(sizeof(*c));
	if (!c) {
		*err = ENOMEM;
		return NULL;
	}
	c->mode = mode;
	c->workspace_size = ZSTD_estimateCCtxSize(LEVEL);
	c->slot_size = ZSTD_compressBound(CKPT_CHUNK_SIZE);
	c->max_chunks = (max_bytes + CKPT_CHUNK_SIZE - 1) / CKPT_CHUNK_SIZE;
	c->fill = &c->banks[0];
	c->tasks = cpu_tasks_new(err);
	c->nworkers = cpu_tasks_count(c->tasks);
	for (int b = 0; !*err && b < 2; b++)
		*err = bank_init(c, &c->banks[b]);
	for (unsigned i = 0; !*err && i < c->nworkers && i < MAX_WORKERS; i++)
		*err = worker_init(c, &c->wk[i]);
	if (*err) {
		compressor_free(c);
		return NULL;
	}
	return c;
}

void compressor_free(struct compressor *c)
{
	if (!c)
		return;
	cpu_tasks_free(c->tasks);
	for (unsigned i = 0; i < MAX_WORKERS; i++)
		worker_free(c, &c->wk[i]);
	for (int b = 0; b < 2; b++)
		bank_free(c, &c->banks[b]);
	scratch_unmap(c, sizeof(*c));
}

/* One frame with its content size (the restart checks it before it
 * commits) and checksum (checked as it is decompressed). */
static size_t compress_frame(struct worker *wk, void *dst, size_t cap, const void *src,
			     size_t len)
{
	ZSTD_parameters params = ZSTD_getParams(LEVEL, len, 0);

	params.fParams.contentSizeFlag = 1;
	params.fParams.checksumFlag = 1;
	return ZSTD_compress_advanced(wk->cctx, dst, cap, src, len, NULL, 0, params);
}

static size_t chunk_len(const struct compressor *c, uint64_t i)
{
	uint64_t left = c->data_size - i * CKPT_CHUNK_SIZE;

	return left < CKPT_CHUNK_SIZE ? left : CKPT_CHUNK_SIZE;
}

static int compress_chunk(struct compressor *c, struct worker *wk, uint64_t i)
{
	size_t len = chunk_len(c, i), n;
	char *slot = c->fill->slots + i * c->slot_size;
	const void *src = c->gather(c->ctx, i * CKPT_CHUNK_SIZE, len, wk->gather);

	if (!src)
		return EIO;
	n = compress_frame(wk, slot, c->slot_size, src, len);
	if (!ZSTD_isError(n) && WORTH(len, n)) {
		c->fill->table[i] = (struct ckpt_chunk){ .stored = n, .format = CKPT_CHUNK_ZSTD };
		return 0;
	}
	memcpy(slot, src, len);
	c->fill->table[i] = (struct ckpt_chunk){ .stored = len, .format = CKPT_CHUNK_RAW };
	return 0;
}

/* Each worker takes the next chunk until none is left. */
static int work(void *p)
{
	struct compressor *c = p;
	unsigned me = __atomic_fetch_add(&c->joined, 1, __ATOMIC_RELAXED);

	for (;;) {
		unsigned i = __atomic_fetch_add(&c->next, 1, __ATOMIC_RELAXED);
		int err;

		if (i >= c->fill->nchunks || __atomic_load_n(&c->error, __ATOMIC_RELAXED))
			return 0;
		err = compress_chunk(c, &c->wk[me], i);
		if (err) {
			__atomic_store_n(&c->error, err, __ATOMIC_RELAXED);
			return 0;
		}
	}
}

/* The queued record's chunks, in order (on the caller's CPU). */
static int write_queued(void *p)
{
	struct compressor *c = p;
	struct bank *b = c->queued;

	for (uint64_t i = 0; b && !c->write_error && i < b->nchunks; i++)
		c->write_error = iw_direct(c->w, b->slots + i * c->slot_size, b->table[i].stored);
	c->queued = NULL;
	return 0;
}

/* Every chunk compressed, on every CPU, while the caller first writes the
 * queued record's chunks; each worker takes the buffers of the order it
 * joined in. */
static int compress_all(struct compressor *c)
{
	c->next = 0;
	c->joined = 0;
	c->error = 0;
	cpu_tasks_run_beside(c->tasks, c->fill->nchunks, work, c,
			     c->queued ? write_queued : NULL, c);
	return c->write_error ? c->write_error : c->error;
}

/* auto: whether a few pieces spread over the record shrink. */
static int looks_compressible(struct compressor *c)
{
	struct worker *wk = &c->wk[0];
	uint64_t raw = 0, packed = 0;
	char *out = c->fill->slots;

	if (c->data_size <= SAMPLES * SAMPLE_SIZE)
		return 1;	/* small: just compress it */
	for (unsigned k = 0; k < SAMPLES; k++) {
		uint64_t off = (c->data_size - SAMPLE_SIZE) / (SAMPLES - 1) * k;
		const void *src;
		size_t n;

		off &= ~(uint64_t)(CKPT_PAGE_SIZE - 1);
		src = c->gather(c->ctx, off, SAMPLE_SIZE, wk->gather);
		if (!src)
			return 1;
		n = compress_frame(wk, out, c->slot_size, src, SAMPLE_SIZE);
		raw += SAMPLE_SIZE;
		packed += ZSTD_isError(n) ? SAMPLE_SIZE : n;
	}
	return WORTH(raw, packed);
}

/*
 * Compress the data_size bytes that gather() gives; returns 0 with
 * *chunks set to the table (*nchunks entries, *stored bytes in all), or 0
 * with *nchunks 0 when the record is better stored raw, or an errno.
 * Either way the chunks an earlier compress_write_later() queued are in w
 * when it returns: what the caller writes next follows them.
 */
int compress_record(struct compressor *c, struct image_writer *w, uint64_t data_size,
		    compress_gather_fn gather, void *ctx, const struct ckpt_chunk **chunks,
		    uint64_t *nchunks, uint64_t *stored)
{
	struct bank *b;
	int err;

	*nchunks = 0;
	*stored = data_size;
	if (!c)
		return 0;
	c->w = w;
	b = c->fill;
	b->nchunks = (data_size + CKPT_CHUNK_SIZE - 1) / CKPT_CHUNK_SIZE;
	c->data_size = data_size;
	c->gather = gather;
	c->ctx = ctx;
	if (!data_size || b->nchunks > c->max_chunks ||
	    (c->mode == CKPT_COMPRESSION_AUTO && !looks_compressible(c))) {
		err = compress_flush(c, w);
		return err ? err : b->nchunks > c->max_chunks ? EOVERFLOW : 0;
	}
	err = compress_all(c);
	if (err)
		return err;
	*stored = 0;
	for (uint64_t i = 0; i < b->nchunks; i++)
		*stored += b->table[i].stored;
	*chunks = b->table;
	*nchunks = b->nchunks;
	return 0;
}

/* The chunks compress_record() made go out with the next record's
 * compression, or at compress_flush(). */
void compress_write_later(struct compressor *c)
{
	c->queued = c->fill;
	c->fill = c->fill == &c->banks[0] ? &c->banks[1] : &c->banks[0];
}

/* The queued chunks, if any, written now. */
int compress_flush(struct compressor *c, struct image_writer *w)
{
	if (!c)
		return 0;
	c->w = w;
	write_queued(c);
	return c->write_error;
}
