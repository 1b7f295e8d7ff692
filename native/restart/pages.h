/* The reader's pieces of page data, shared with the page server of a
 * lazy restore (lazy_server.c). */
#ifndef CKPT_RESTART_PAGES_H
#define CKPT_RESTART_PAGES_H

#include <stdint.h>
#include <zstd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>
#include "restart.h"

/* Raw: len bytes at offset off of file fd belong at addr.  A chunk (lv
 * set): the len bytes of lv's page data from pos on, stored at off.  Pages
 * of an earlier image's chunk (ref set): len bytes from into on of its
 * chunk_len decompressed bytes, stored at off, belong at addr. */
struct piece {
	uint64_t addr, len, off;
	const uint64_t *block_sum;	/* its block's checksum, if the reader checks it */
	uint64_t block_lo, block_hi;	/* and where that block lies in the file */
	int fd;
	const struct loaded_vma *lv;
	const struct ckpt_page_ref *ref;
	uint64_t pos;
	uint32_t stored, format;
};

/* What one task decompresses and hashes with. */
struct unpacker {
	XXH3_state_t block_hash;	/* first: 64-byte aligned */
	ZSTD_DCtx *dctx;
	char *in;			/* a chunk as stored */
	char *out;			/* a chunk whose pages are not contiguous */
	char *gap;			/* record headers of a checked block */
};

/* What a task takes at once: a piece, or the pieces of a block it checks. */
struct unit {
	unsigned first, count;
};

size_t chunk_len(const struct loaded_vma *lv, uint64_t i);
void unpacker_init(struct unpacker *u);
long read_at(int fd, uint64_t addr, uint64_t len, uint64_t off);
uint64_t run_of(const struct loaded_vma *lv, uint64_t pos, uint64_t *into);
long hash_gap(int fd, uint64_t from, uint64_t to, struct unpacker *u);
unsigned reader_room(const struct image *img, int *compressed, uint64_t piece);
void reader_plan_into(struct piece *pieces, struct unit *units, unsigned max, uint64_t max_piece);
unsigned reader_plan_units(uint64_t *bytes);
void reader_advise(const struct piece *pieces, const struct unit *unit);

#endif
