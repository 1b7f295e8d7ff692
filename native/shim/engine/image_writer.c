/*
 * Writing one image file: small records go through a buffer, page data is
 * written straight from the application's memory in large write()s.  Every
 * byte is fed to the block checksum (ckpt_image.h), which ends up in the
 * manifest; the blocks' own checksums go beside the image, in
 * <image>.sum, so that a restart can check each block as it reads it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>
#include "fast_hash.h"
#include "ckpt_io.h"
#include "shim.h"

#define BUF_SIZE (1 << 20)
#define DIRECT_CHUNK (64 << 20)
#define WRITEBACK_STEP (32 << 20)	/* the disk starts on this much at once */

struct image_writer {
	XXH3_state_t hash;		/* first: needs 64-byte alignment */
	XXH3_state_t block_hash;	/* of the current block */
	uint64_t block_fill;		/* its bytes so far */
	int fd;
	int error;			/* first errno, sticky */
	uint64_t offset;		/* bytes handed to the file so far */
	uint64_t written;		/* bytes write() took */
	uint64_t writeback;		/* bytes whose writeback has been started */
	uint64_t *sums;			/* each block's checksum, for <image>.sum */
	size_t nsums, sums_cap;		/* in entries */
	int dirfd;			/* the caller's: open until iw_finish */
	char name[128];
	size_t buflen;
	char buf[BUF_SIZE];
};

/* One more block checksum kept; an error (no memory) is the writer's. */
static void keep_sum(struct image_writer *w, uint64_t digest)
{
	if (w->nsums == w->sums_cap) {
		size_t cap = w->sums_cap ? 2 * w->sums_cap : 512;
		uint64_t *more = scratch_map(cap * sizeof(*more));

		if (!more) {
			w->error = w->error ? w->error : ENOMEM;
			return;
		}
		if (w->sums) {
			memcpy(more, w->sums, w->nsums * sizeof(*more));
			scratch_unmap(w->sums, w->sums_cap * sizeof(*more));
		}
		w->sums = more;
		w->sums_cap = cap;
	}
	w->sums[w->nsums++] = digest;
}

static void end_block(struct image_writer *w)
{
	uint64_t digest = XXH3_64bits_digest(&w->block_hash);	/* x86: little-endian */

	keep_sum(w, digest);
	fast_xxh3_64_update(&w->hash, &digest, sizeof(digest));
	XXH3_64bits_reset(&w->block_hash);
	w->block_fill = 0;
}

static void hash_update(struct image_writer *w, const void *p, size_t len)
{
	while (len) {
		size_t n = CKPT_CHECKSUM_BLOCK - w->block_fill;

		if (n > len)
			n = len;
		fast_xxh3_64_update(&w->block_hash, p, n);
		w->block_fill += n;
		if (w->block_fill == CKPT_CHECKSUM_BLOCK)
			end_block(w);
		p = (const char *)p + n;
		len -= n;
	}
}

/*
 * Start the disk on what was written so far instead of leaving it all
 * to the final fsync: a large image does not reach the kernel's
 * background threshold, so the disk would sit idle while we read and
 * hash memory.
 */
static void start_writeback(struct image_writer *w)
{
	if (w->written - w->writeback < WRITEBACK_STEP)
		return;
	sync_file_range(w->fd, w->writeback, w->written - w->writeback, SYNC_FILE_RANGE_WRITE);
	w->writeback = w->written;
}

static int write_all(struct image_writer *w, const void *p, size_t len)
{
	const char *c = p;

	while (len) {
		ssize_t n = write(w->fd, c, len > DIRECT_CHUNK ? DIRECT_CHUNK : len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return w->error = errno;
		if (n == 0)
			return w->error = EIO;
		c += n;
		len -= n;
		w->written += n;
		start_writeback(w);
	}
	return 0;
}

static int flush(struct image_writer *w)
{
	int err;

	if (!w->buflen || w->error)
		return w->error;
	err = write_all(w, w->buf, w->buflen);
	w->buflen = 0;
	return err;
}

struct image_writer *iw_open(int dirfd, const char *name)
{
	struct image_writer *w = scratch_map(sizeof(*w));

	if (!w)
		return NULL;
	w->dirfd = dirfd;
	snprintf(w->name, sizeof(w->name), "%s", name);
	w->fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (w->fd < 0) {
		int err = errno;

		scratch_unmap(w, sizeof(*w));
		errno = err;
		return NULL;
	}
	XXH3_64bits_reset(&w->hash);
	XXH3_64bits_reset(&w->block_hash);
	return w;
}

/* Copy first, then hash the copy: the source may be the checkpoint
 * thread's own stack, which changes under the hash function's frames. */
int iw_append(struct image_writer *w, const void *p, size_t len)
{
	if (w->error)
		return w->error;
	w->offset += len;
	while (len) {
		size_t n = BUF_SIZE - w->buflen;

		if (n > len)
			n = len;
		memcpy(w->buf + w->buflen, p, n);
		hash_update(w, w->buf + w->buflen, n);
		w->buflen += n;
		p = (const char *)p + n;
		len -= n;
		if (w->buflen == BUF_SIZE && flush(w))
			return w->error;
	}
	return 0;
}

int iw_record(struct image_writer *w, uint32_t type, const void *p, size_t len)
{
	struct ckpt_record rec = { .type = type, .size = len };

	iw_append(w, &rec, sizeof(rec));
	return iw_append(w, p, len);
}

/* Page data: written from where it lies, bypassing the buffer.  Only for
 * memory that stays still while we write (not our own stack). */
int iw_direct(struct image_writer *w, const void *p, size_t len)
{
	if (flush(w))
		return w->error;
	hash_update(w, p, len);
	w->offset += len;
	return write_all(w, p, len);
}

int iw_pad_to_page(struct image_writer *w)
{
	static const char zeros[CKPT_PAGE_SIZE];
	size_t pad = (CKPT_PAGE_SIZE - w->offset % CKPT_PAGE_SIZE) % CKPT_PAGE_SIZE;

	return iw_append(w, zeros, pad);
}

uint64_t iw_offset(const struct image_writer *w)
{
	return w->offset;
}

static void free_writer(struct image_writer *w)
{
	if (w->sums)
		scratch_unmap(w->sums, w->sums_cap * sizeof(*w->sums));
	scratch_unmap(w, sizeof(*w));
}

/* <image>.sum: the blocks' checksums, the bytes whose XXH3 is the
 * image's (ckpt-restart checks it against the manifest first). */
static int write_sums(struct image_writer *w)
{
	char name[sizeof(w->name) + 8];
	int fd, err = 0;

	iw_sums_name(name, sizeof(name), w->name);
	fd = openat(w->dirfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return errno;
	err = ckpt_write_all(fd, w->sums, w->nsums * sizeof(*w->sums));
	if (!err && fsync(fd))
		err = errno;
	if (close(fd) && !err)
		err = errno;
	if (err)
		unlinkat(w->dirfd, name, 0);
	return err;
}

/* Flush, fsync and close, and write <image>.sum; the writer is freed
 * either way. */
int iw_finish(struct image_writer *w, uint64_t *size, uint64_t *xxh3)
{
	int err = flush(w);

	if (!err && fsync(w->fd))
		err = errno;
	if (close(w->fd) && !err)
		err = errno;
	*size = w->offset;
	if (w->block_fill)
		end_block(w);
	*xxh3 = XXH3_64bits_digest(&w->hash);
	if (!err)
		err = w->error ?: write_sums(w);
	free_writer(w);
	return err;
}

/* Failed checkpoint: close and remove the partial file. */
void iw_abort(struct image_writer *w, int dirfd, const char *name)
{
	close(w->fd);
	unlinkat(dirfd, name, 0);
	free_writer(w);
}

void iw_sums_name(char *out, size_t size, const char *image)
{
	snprintf(out, size, "%s.sum", image);
}

uint64_t shim_xxh3(const void *p, size_t len)
{
	return XXH3_64bits(p, len);
}
