/*
 * Reading the saved pages into place.  The cost of a restart is mostly the
 * kernel's: faulting in fresh pages and copying from the page cache.  A
 * large image is cut into pieces that every CPU reads (helpers.c).
 * Compressed page data is a piece per chunk (ckpt_image.h), decompressed
 * straight into place by whichever CPU takes it; the zstd contexts and
 * buffers are made before the point of no return, one per task.
 *
 * A block of the image (CKPT_CHECKSUM_BLOCK) that holds the records of
 * such regions alone is checked here, as it is read (image.c left it out,
 * its checksum in <image>.sum): its pieces are one task, read a step at a
 * time and hashed in place while the step is in the cache, the record
 * headers between them read and hashed on the way, so that a restart
 * reads the image from the disk once.  A block that does not match ends
 * the process before it runs (the restart fails, saying so).
 *
 * reader_prepare() runs before the point of no return; the rest after it,
 * with raw system calls only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#include "restart.h"
#include "sys.h"
#define XXH_INLINE_ALL
#include <xxhash.h>
#include "fast_hash.h"
#include "pages.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define PIECE (32UL << 20)		/* small enough to share out evenly */
#define STEP (256UL << 10)		/* faulted in, read, hashed while in the cache */
#define READ_AHEAD (128UL << 20)	/* asked of the disk before it is read */
#define GAP_STEP (1UL << 20)		/* record headers between pieces, at once */
#define PARALLEL_FROM (128UL << 20)	/* below this, helpers cost more than they save */

static struct {
	struct piece *pieces;
	unsigned npieces, max_pieces;
	struct unit *units;
	uint64_t *before;		/* page data before each unit, or NULL */
	unsigned nunits;
	uint64_t bytes;
	unsigned next;			/* the next unit to take (atomic) */
	unsigned ahead;			/* the next unit to read ahead (atomic) */
	unsigned joined;		/* tasks at work, each an unpacker (atomic) */
	uint64_t piece_max;		/* PIECE, or less for the page server */
	long error;			/* the first failed read (atomic) */
	struct unpacker unpackers[HELPERS_MAX_TASKS];
} plan;

size_t chunk_len(const struct loaded_vma *lv, uint64_t i)
{
	uint64_t left = lv->v.data_size - i * CKPT_CHUNK_SIZE;

	return left < CKPT_CHUNK_SIZE ? left : CKPT_CHUNK_SIZE;
}

void unpacker_init(struct unpacker *u)
{
	size_t size = ZSTD_estimateDCtxSize();

	u->dctx = ZSTD_initStaticDCtx(arena_alloc(size), size);
	u->in = arena_alloc(ZSTD_compressBound(CKPT_CHUNK_SIZE));
	u->out = arena_alloc(CKPT_CHUNK_SIZE);
	if (!u->dctx)
		die("cannot make a zstd decompression context");
}

/*
 * Before the point of no return: the chunk table adds up, and each zstd
 * chunk's frame header says the size the chunk must have.  (Its content
 * is checked by the frame's checksum as it is decompressed.)
 */
void check_chunks(struct image *img, const struct loaded_vma *lv)
{
	uint64_t total = 0, off = lv->v.data_offset;

	if (!lv->nchunks)
		return;
	for (uint64_t i = 0; i < lv->nchunks; i++) {
		const struct ckpt_chunk *c = &lv->chunks[i];
		size_t len = chunk_len(lv, i);
		char head[ZSTD_FRAMEHEADERSIZE_MAX];
		size_t n = c->stored < sizeof(head) ? c->stored : sizeof(head);

		if ((c->format == CKPT_CHUNK_RAW && c->stored != len) ||
		    (c->format == CKPT_CHUNK_ZSTD &&
		     (!c->stored || c->stored > ZSTD_compressBound(len))) ||
		    c->format > CKPT_CHUNK_ZSTD)
			die("%s: corrupt memory record (compressed chunk %llu at %#llx)", img->file,
			    (unsigned long long)i, (unsigned long long)lv->v.start);
		total += c->stored;
		if (total > lv->v.stored_size)
			break;
		if (c->format == CKPT_CHUNK_ZSTD) {
			read_exact_at(img, head, n, off);
			if (ZSTD_getFrameContentSize(head, n) != len)
				die("%s: corrupt compressed chunk %llu of the memory at %#llx",
				    img->file, (unsigned long long)i, (unsigned long long)lv->v.start);
		}
		off += c->stored;
	}
	if (total != lv->v.stored_size)
		die("%s: corrupt memory record (compressed chunks add up to %llu bytes, not %llu)",
		    img->file, (unsigned long long)total, (unsigned long long)lv->v.stored_size);
}

static void make_units(void);

static uint64_t piece_max(void)
{
	return plan.piece_max ? plan.piece_max : PIECE;
}

/* How many pieces the regions of img can make at most. */
unsigned reader_room(const struct image *img, int *compressed, uint64_t piece)
{
	unsigned max = 0;

	*compressed = 0;
	for (unsigned i = 0; i < img->nvmas; i++) {
		const struct loaded_vma *lv = &img->vmas[i];

		/* a piece ends at a block's end too */
		max += lv->v.nruns + lv->nchunks + lv->v.nrefs + 1 +
		       lv->v.data_size / CKPT_CHECKSUM_BLOCK;
		*compressed |= lv->nchunks > 0;
		for (unsigned r = 0; r < lv->v.nruns; r++)
			max += lv->runs[r].npages * CKPT_PAGE_SIZE / piece;
		for (unsigned r = 0; r < lv->v.nrefs; r++) {
			max += lv->refs[r].len / piece;
			*compressed |= lv->refs[r].stored > 0;
		}
	}
	return max;
}

/* Room for the pieces of every region of img. */
void reader_prepare(struct image *img)
{
	int compressed;
	unsigned max = reader_room(img, &compressed, PIECE);

	plan.max_pieces = max;
	plan.pieces = arena_alloc((max + 1) * sizeof(*plan.pieces));
	plan.units = arena_alloc((max + 1) * sizeof(*plan.units));
	plan.before = arena_alloc((max + 1) * sizeof(*plan.before));
	for (unsigned i = 0; compressed && i < HELPERS_MAX_TASKS; i++)
		unpacker_init(&plan.unpackers[i]);
	for (unsigned i = 0; img->block_sums && i < HELPERS_MAX_TASKS; i++)
		plan.unpackers[i].gap = arena_alloc(GAP_STEP);
}

/* The page server's plan of one process: pieces of at most max_piece
 * bytes into arrays of its own with room for max of them. */
void reader_plan_into(struct piece *pieces, struct unit *units, unsigned max, uint64_t max_piece)
{
	plan.pieces = pieces;
	plan.units = units;
	plan.before = NULL;
	plan.max_pieces = max;
	plan.npieces = 0;
	plan.bytes = 0;
	plan.piece_max = max_piece;
}

/* The plan's units, once every piece is added; *bytes: their page data. */
unsigned reader_plan_units(uint64_t *bytes)
{
	make_units();
	*bytes = plan.bytes;
	return plan.nunits;
}

static void add_piece(const struct piece *p)
{
	if (plan.npieces == plan.max_pieces)
		fatal("more page data than the image's runs", -EOVERFLOW);
	plan.pieces[plan.npieces++] = *p;
	plan.bytes += p->len;
}

/* The chunks of a region with compressed page data. */
void reader_add_chunks(const struct image *img, const struct loaded_vma *lv)
{
	uint64_t off = lv->v.data_offset;

	for (uint64_t i = 0; i < lv->nchunks; i++) {
		struct piece p = { .len = chunk_len(lv, i), .off = off, .fd = img->fd, .lv = lv,
				   .pos = i * CKPT_CHUNK_SIZE, .stored = lv->chunks[i].stored,
				   .format = lv->chunks[i].format };

		add_piece(&p);
		off += p.stored;
	}
}

/* The pages at off in file fd belong at addr; img: the image whose
 * deferred blocks the reader checks, or NULL. */
static void add_raw(const struct image *img, int fd, uint64_t addr, uint64_t len, uint64_t off)
{
	while (len) {
		uint64_t block = off / CKPT_CHECKSUM_BLOCK, lo = block * CKPT_CHECKSUM_BLOCK;
		uint64_t n = lo + CKPT_CHECKSUM_BLOCK - off;
		int checked = img && img->block_sums && img->deferred[block];

		if (n > piece_max())
			n = piece_max();
		if (n > len)
			n = len;
		add_piece(&(struct piece){
			.addr = addr, .len = n, .off = off, .fd = fd,
			.block_sum = checked ? &img->block_sums[block] : NULL, .block_lo = lo,
			.block_hi = !checked || lo + CKPT_CHECKSUM_BLOCK < img->size ?
				lo + CKPT_CHECKSUM_BLOCK : img->size });
		addr += n;
		off += n;
		len -= n;
	}
}

/* The pages at off in the image belong at addr. */
void reader_add(const struct image *img, uint64_t addr, uint64_t len, uint64_t off)
{
	add_raw(img, img->fd, addr, len, off);
}

/* The pages of a region that earlier images hold (incremental). */
void reader_add_refs(const struct image *img, const struct loaded_vma *lv)
{
	for (uint64_t i = 0; i < lv->v.nrefs; i++) {
		const struct ckpt_page_ref *r = &lv->refs[i];
		int fd = img->sources[r->source].fd;

		if (!r->stored)
			add_raw(NULL, fd, lv->v.start + r->offset, r->len, r->off);
		else
			add_piece(&(struct piece){ .addr = lv->v.start + r->offset, .len = r->len,
						   .off = r->off, .fd = fd, .ref = r,
						   .stored = r->stored,
						   .format = CKPT_CHUNK_ZSTD });
	}
}

long read_at(int fd, uint64_t addr, uint64_t len, uint64_t off)
{
	while (len) {
		long n = sys4(SYS_pread64, fd, addr, len, off);

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

/* Fault in the pages a decompression writes to: a page that cannot be
 * (a private map past its file's end) fails here with an error, not
 * with SIGBUS under memcpy.  EINVAL: a kernel without it. */
static long populate(uint64_t addr, uint64_t len)
{
	long r = sys3(SYS_madvise, addr, len, MADV_POPULATE_WRITE);

	return r == -EINVAL ? 0 : r;
}

/* The run of lv holding byte pos of its page data, and where in it. */
uint64_t run_of(const struct loaded_vma *lv, uint64_t pos, uint64_t *into)
{
	uint64_t r = 0, at = 0;

	for (; r < lv->v.nruns; r++) {
		uint64_t bytes = lv->runs[r].npages * CKPT_PAGE_SIZE;

		if (pos < at + bytes)
			break;
		at += bytes;
	}
	*into = pos - at;
	return r;
}

/* Bytes [pos, pos + len) of lv's page data, from src into place: the
 * region mapped at base. */
static long scatter(const struct loaded_vma *lv, char *base, uint64_t pos, const char *src,
		    uint64_t len)
{
	uint64_t into, r = run_of(lv, pos, &into);

	for (; len && r < lv->v.nruns; r++, into = 0) {
		uint64_t n = lv->runs[r].npages * CKPT_PAGE_SIZE - into;
		char *to = base + lv->runs[r].offset + into;
		long err;

		if (n > len)
			n = len;
		err = populate((uint64_t)to, n);
		if (err)
			return err;
		memcpy(to, src, n);
		src += n;
		len -= n;
	}
	return 0;
}

static long read_chunk(const struct piece *p, struct unpacker *u)
{
	uint64_t into, r = run_of(p->lv, p->pos, &into);
	const struct ckpt_run *run = &p->lv->runs[r];	/* r < nruns: runs add up */
	int direct = run->npages * CKPT_PAGE_SIZE - into >= p->len;
	uint64_t addr = p->lv->v.start + run->offset + into;
	char *out = direct ? (char *)addr : u->out;
	long err;

	if (direct && (err = populate(addr, p->len)))
		return err;
	if (p->format == CKPT_CHUNK_RAW) {
		err = read_at(p->fd, (uint64_t)out, p->len, p->off);
	} else {
		err = read_at(p->fd, (uint64_t)u->in, p->stored, p->off);
		if (!err && ZSTD_decompressDCtx(u->dctx, out, p->len, u->in, p->stored) != p->len)
			err = -EBADMSG;	/* also a checksum that does not match */
	}
	if (!err && !direct)
		err = scatter(p->lv, (char *)p->lv->v.start, p->pos, out, p->len);
	return err;
}

/* Pages of an earlier image's zstd chunk: the whole chunk, then them. */
static long read_ref_chunk(const struct piece *p, struct unpacker *u)
{
	const struct ckpt_page_ref *r = p->ref;
	long err = read_at(p->fd, (uint64_t)u->in, r->stored, r->off);

	if (!err && ZSTD_decompressDCtx(u->dctx, u->out, r->chunk_len, u->in, r->stored) !=
		    r->chunk_len)
		err = -EBADMSG;	/* also a checksum that does not match */
	if (!err)
		err = populate(p->addr, p->len);
	if (!err)
		memcpy((void *)p->addr, u->out + r->into, p->len);
	return err;
}

/*
 * A raw piece into place a step at a time: the step's pages faulted in
 * at once (zeroed, so now in the cache), the file's bytes read over them
 * and, for a checked block, hashed, all before the step leaves the cache:
 * the memory is written once and read once, not three times.
 */
static long fill_steps(const struct piece *p, XXH3_state_t *hash)
{
	for (uint64_t done = 0; done < p->len; done += STEP) {
		uint64_t n = p->len - done < STEP ? p->len - done : STEP;
		long err;

		sys3(SYS_madvise, p->addr + done, n, MADV_POPULATE_WRITE);	/* batch the faults */
		err = read_at(p->fd, p->addr + done, n, p->off + done);
		if (err)
			return err;
		if (hash)
			fast_xxh3_64_update(hash, (const void *)(p->addr + done), n);
	}
	return 0;
}

static long read_piece(const struct piece *p, struct unpacker *u)
{
	if (p->lv)
		return read_chunk(p, u);
	if (p->ref)
		return read_ref_chunk(p, u);
	return fill_steps(p, NULL);
}

/* The file's bytes [from, to) of fd, hashed (record headers). */
long hash_gap(int fd, uint64_t from, uint64_t to, struct unpacker *u)
{
	while (from < to) {
		uint64_t n = to - from < GAP_STEP ? to - from : GAP_STEP;
		long err = read_at(fd, (uint64_t)u->gap, n, from);

		if (err)
			return err;
		fast_xxh3_64_update(&u->block_hash, u->gap, n);
		from += n;
	}
	return 0;
}

/* The pieces of one block, in file order, each step hashed once read,
 * with the bytes between them; -EILSEQ if the block is not what the
 * writer wrote. */
static long read_block(const struct piece *p, unsigned count, struct unpacker *u)
{
	const uint64_t *want = p->block_sum;
	uint64_t at = p->block_lo, end = p->block_hi;
	int fd = p->fd;
	long err = 0;

	XXH3_64bits_reset(&u->block_hash);
	for (; count-- && !err; p++) {
		err = hash_gap(fd, at, p->off, u);
		if (!err)
			err = fill_steps(p, &u->block_hash);
		at = p->off + p->len;
	}
	if (!err)
		err = hash_gap(fd, at, end, u);
	if (err)
		return err;
	return XXH3_64bits_digest(&u->block_hash) == *want ? 0 : -EILSEQ;
}

/* A piece alone, or the consecutive pieces of one checked block. */
static void make_units(void)
{
	uint64_t bytes = 0;

	plan.nunits = 0;
	for (unsigned i = 0; i < plan.npieces; i++) {
		struct unit *last = plan.nunits ? &plan.units[plan.nunits - 1] : NULL;
		const struct piece *p = &plan.pieces[i];

		if (last && p->block_sum && plan.pieces[last->first].block_sum == p->block_sum) {
			last->count++;
		} else {
			if (plan.before)
				plan.before[plan.nunits] = bytes;
			plan.units[plan.nunits++] = (struct unit){ i, 1 };
		}
		bytes += p->len;
	}
}

/* The file bytes a unit reads: the disk is asked for them (readahead)
 * while earlier units are read, so that it has many requests at once. */
void reader_advise(const struct piece *pieces, const struct unit *unit)
{
	const struct piece *p = &pieces[unit->first];
	const struct piece *last = p + unit->count - 1;
	uint64_t lo = p->block_sum ? p->block_lo : p->off;
	uint64_t hi = p->block_sum ? p->block_hi : last->off + (last->stored ? last->stored : last->len);

	sys4(SYS_fadvise64, p->fd, lo, hi - lo, POSIX_FADV_WILLNEED);
}

/* Units up to READ_AHEAD bytes past unit i asked for, each by one task. */
static void read_ahead(unsigned i)
{
	uint64_t until = plan.before[i] + READ_AHEAD;

	for (;;) {
		unsigned a = __atomic_load_n(&plan.ahead, __ATOMIC_RELAXED);

		if (a >= plan.nunits || plan.before[a] > until)
			return;
		if (__atomic_compare_exchange_n(&plan.ahead, &a, a + 1, 0, __ATOMIC_RELAXED,
						__ATOMIC_RELAXED))
			reader_advise(plan.pieces, &plan.units[a]);
	}
}

static int read_pieces(void *unused)
{
	unsigned me = __atomic_fetch_add(&plan.joined, 1, __ATOMIC_RELAXED);
	struct unpacker *u = &plan.unpackers[me % HELPERS_MAX_TASKS];

	(void)unused;
	for (;;) {
		unsigned i = __atomic_fetch_add(&plan.next, 1, __ATOMIC_RELAXED);
		const struct unit *unit = &plan.units[i];
		const struct piece *p;
		long err;

		if (i >= plan.nunits || __atomic_load_n(&plan.error, __ATOMIC_RELAXED))
			return 0;
		p = &plan.pieces[unit->first];
		if (plan.before)
			read_ahead(i);
		err = p->block_sum ? read_block(p, unit->count, u) : read_piece(p, u);
		if (err) {
			__atomic_store_n(&plan.error, err, __ATOMIC_RELAXED);
			return 0;
		}
	}
}

/*
 * Before the point of no return, one region's pages into memory mapped at
 * base (shared memory objects, made before): on this CPU, the errors of
 * a damaged image each a line of their own.
 */
void read_region_at(struct image *img, const struct loaded_vma *lv, char *base)
{
	static struct unpacker u;
	uint64_t off = lv->v.data_offset;

	for (uint64_t r = 0; !lv->nchunks && r < lv->v.nruns; r++) {
		uint64_t bytes = lv->runs[r].npages * CKPT_PAGE_SIZE;

		madvise(base + lv->runs[r].offset, bytes, MADV_POPULATE_WRITE);
		read_exact_at(img, base + lv->runs[r].offset, bytes, off);
		off += bytes;
	}
	if (lv->nchunks && !u.dctx)
		unpacker_init(&u);
	for (uint64_t i = 0; i < lv->nchunks; i++) {
		const struct ckpt_chunk *c = &lv->chunks[i];
		size_t len = chunk_len(lv, i);

		if (c->format == CKPT_CHUNK_RAW) {
			read_exact_at(img, u.out, len, off);
		} else {
			read_exact_at(img, u.in, c->stored, off);
			if (ZSTD_decompressDCtx(u.dctx, u.out, len, u.in, c->stored) != len)
				die("%s: corrupt compressed chunk %llu of the memory at %#llx", img->file,
				    (unsigned long long)i, (unsigned long long)lv->v.start);
		}
		if (scatter(lv, base, i * CKPT_CHUNK_SIZE, u.out, len))
			die("%s: the shared memory at %#llx cannot hold its pages", img->file,
			    (unsigned long long)lv->v.start);
		off += c->stored;
	}
}

/* Read every piece added; the process is lost if one cannot be read. */
void reader_run(void)
{
	make_units();
	if (plan.bytes >= PARALLEL_FROM)
		helpers_run(read_pieces, NULL);
	else
		read_pieces(NULL);
	if (plan.error == -EBADMSG)
		fatal("a compressed chunk of page data is corrupt", plan.error);
	if (plan.error == -EILSEQ)
		fatal("image checksum mismatch in its page data (corrupt image)", plan.error);
	if (plan.error)
		fatal("reading page data", plan.error);
}
