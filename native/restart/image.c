/*
 * Reading an image: header checks, the optional checksum, and
 * the records (everything but page data) into the arena.  All of it
 * happens before anything of the running process is changed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>
#include "restart.h"

void read_exact_at(struct image *img, void *buf, size_t len, uint64_t off)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = pread(img->fd, (char *)buf + done, len - done, off + done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("%s: read error: %s", img->file, strerror(errno));
		if (n == 0)
			die("%s: truncated image", img->file);
		done += n;
	}
}

static void check_header(struct image *img)
{
	struct ckpt_image_header *h = &img->hdr;
	uint64_t want = h->header_xxh;

	if (h->magic != CKPT_IMAGE_MAGIC)
		die("%s: not a ckpt image (bad magic)", img->file);
	h->header_xxh = 0;
	if (XXH3_64bits(h, sizeof(*h)) != want)
		die("%s: corrupt image header (checksum mismatch)", img->file);
	h->header_xxh = want;
	if (h->arch != CKPT_ARCH_X86_64)
		die("%s: image is for another architecture (ELF machine %u)", img->file, h->arch);
	if (h->format_version != CKPT_IMAGE_VERSION)
		die("%s: image format version %u, this ckpt-restart reads %u", img->file,
		    h->format_version, CKPT_IMAGE_VERSION);
	if (h->page_size != CKPT_PAGE_SIZE || h->header_size != CKPT_HEADER_SIZE)
		die("%s: unexpected page or header size", img->file);
	if (h->reserve_start != CKPT_RESERVE_START ||
	    h->reserve_end != CKPT_RESERVE_END)
		die("%s: image reserves another restart range", img->file);
}

/* The blocks of one image, hashed by every CPU (helpers.c). */
struct block_hashing {
	const char *data;
	uint64_t size, nblocks;
	uint64_t *digests;
	uint64_t next;			/* the next block to take (atomic) */
};

static int hash_blocks(void *arg)
{
	struct block_hashing *h = arg;

	for (;;) {
		uint64_t i = __atomic_fetch_add(&h->next, 1, __ATOMIC_RELAXED);
		uint64_t off = i * CKPT_CHECKSUM_BLOCK;

		if (i >= h->nblocks)
			return 0;
		h->digests[i] = XXH3_64bits(h->data + off, h->size - off < CKPT_CHECKSUM_BLOCK ?
					    h->size - off : CKPT_CHECKSUM_BLOCK);
	}
}

/* Hashed straight from the page cache through a temporary mapping. */
static void check_checksum(struct image *img, const char *want_hex, uint64_t size)
{
	uint64_t want = strtoull(want_hex, NULL, 16);
	struct block_hashing h = { .size = size };
	uint64_t got;
	void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, img->fd, 0);

	if (p == MAP_FAILED)
		die("%s: cannot map the image: %s", img->file, strerror(errno));
	h.data = p;
	h.nblocks = (size + CKPT_CHECKSUM_BLOCK - 1) / CKPT_CHECKSUM_BLOCK;
	h.digests = malloc(h.nblocks * sizeof(*h.digests) + 1);
	if (!h.digests)
		die("out of memory");
	helpers_run(hash_blocks, &h);
	munmap(p, size);
	got = XXH3_64bits(h.digests, h.nblocks * sizeof(*h.digests));	/* x86: little-endian */
	free(h.digests);
	if (got != want)
		die("%s: image checksum mismatch (corrupt or truncated image)", img->file);
}

static void *read_payload(struct image *img, size_t len, uint64_t off)
{
	char *p = arena_alloc(len + 1);

	read_exact_at(img, p, len, off);
	p[len] = '\0';
	return p;
}

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102
#endif

/* Whether this kernel installs guard pages: asked once, on a page of our own. */
static int guards_supported(void)
{
	static int known = -1;
	void *p;

	if (known >= 0)
		return known;
	p = mmap(NULL, CKPT_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	known = p != MAP_FAILED && madvise(p, CKPT_PAGE_SIZE, MADV_GUARD_INSTALL) == 0;
	if (p != MAP_FAILED)
		munmap(p, CKPT_PAGE_SIZE);
	return known;
}

static void load_vma(struct image *img, uint64_t off, uint64_t size)
{
	struct loaded_vma *lv;
	size_t meta;

	if (img->nvmas == img->max_vmas || img->nvmas == MAX_VMAS)
		die("%s: too many memory regions", img->file);
	lv = &img->vmas[img->nvmas++];
	if (size < sizeof(lv->v))
		die("%s: corrupt memory record", img->file);
	read_exact_at(img, &lv->v, sizeof(lv->v), off);
	meta = lv->v.path_len + (lv->v.nruns + lv->v.nguards) * sizeof(struct ckpt_run);
	if (lv->v.nruns > size / sizeof(struct ckpt_run) ||
	    lv->v.nguards > size / sizeof(struct ckpt_run) || sizeof(lv->v) + meta > size ||
	    lv->v.end <= lv->v.start || lv->v.data_offset + lv->v.data_size > off + size)
		die("%s: corrupt memory record", img->file);
	if (lv->v.start < CKPT_RESERVE_END && lv->v.end > CKPT_RESERVE_START &&
	    lv->v.kind != CKPT_VMA_VDSO)
		die("%s: a memory region overlaps the restart range", img->file);
	lv->path = read_payload(img, lv->v.path_len, off + sizeof(lv->v));
	lv->runs = read_payload(img, lv->v.nruns * sizeof(struct ckpt_run),
				off + sizeof(lv->v) + lv->v.path_len);
	lv->guards = read_payload(img, lv->v.nguards * sizeof(struct ckpt_run),
				  off + sizeof(lv->v) + lv->v.path_len +
				  lv->v.nruns * sizeof(struct ckpt_run));
	for (uint64_t i = 0; i < lv->v.nguards; i++)
		if (lv->guards[i].offset + lv->guards[i].npages * CKPT_PAGE_SIZE >
		    lv->v.end - lv->v.start)
			die("%s: corrupt memory record (guard pages)", img->file);
	if (lv->v.nguards && !guards_supported())
		die("%s: the process has guard pages (MADV_GUARD_INSTALL), which this kernel "
		    "cannot install (Linux 6.13 or later can)", img->file);
}

static void load_fd(struct image *img, uint64_t off, uint64_t size)
{
	struct loaded_fd *lf;
	char *payload;

	if (img->nfds == img->max_fds || img->nfds == MAX_FDS)
		die("%s: too many file descriptors", img->file);
	lf = &img->fds[img->nfds++];
	if (size < sizeof(lf->f))
		die("%s: corrupt fd record", img->file);
	payload = read_payload(img, size, off);
	memcpy(&lf->f, payload, sizeof(lf->f));
	if (sizeof(lf->f) + lf->f.path_len + lf->f.data_size != size)
		die("%s: corrupt fd record", img->file);
	lf->path = arena_alloc(lf->f.path_len + 1);
	memcpy((char *)lf->path, payload + sizeof(lf->f), lf->f.path_len);
	((char *)lf->path)[lf->f.path_len] = '\0';
	lf->data = payload + sizeof(lf->f) + lf->f.path_len;
}

static void load_records(struct image *img, uint64_t file_size)
{
	uint64_t off = CKPT_HEADER_SIZE;

	for (;;) {
		struct ckpt_record rec;

		if (off + sizeof(rec) > file_size)
			die("%s: truncated image (no end record)", img->file);
		read_exact_at(img, &rec, sizeof(rec), off);
		off += sizeof(rec);
		if (rec.size > file_size - off)
			die("%s: truncated image", img->file);
		switch (rec.type) {
		case CKPT_REC_PROCESS:
			if (rec.size != sizeof(*img->proc))
				die("%s: corrupt process record", img->file);
			img->proc = read_payload(img, rec.size, off);
			break;
		case CKPT_REC_THREAD:
			if (rec.size != sizeof(struct ckpt_thread) || img->nthreads == img->max_threads)
				die("%s: corrupt thread record", img->file);
			read_exact_at(img, &img->threads[img->nthreads++], rec.size, off);
			break;
		case CKPT_REC_VMA:
			load_vma(img, off, rec.size);
			break;
		case CKPT_REC_FD:
			load_fd(img, off, rec.size);
			break;
		case CKPT_REC_PLUGIN:
			break;		/* plugins keep their state in memory */
		case CKPT_REC_END:
			return;
		default:
			die("%s: unknown record type %u", img->file, rec.type);
		}
		off += rec.size;
	}
}

/* How many records of each kind, so many images fit in the arena. */
static void count_records(struct image *img, uint64_t file_size, unsigned count[])
{
	uint64_t off = CKPT_HEADER_SIZE;
	struct ckpt_record rec;

	while (off + sizeof(rec) <= file_size) {
		read_exact_at(img, &rec, sizeof(rec), off);
		off += sizeof(rec);
		if (rec.type == CKPT_REC_END || rec.size > file_size - off)
			return;
		if (rec.type < CKPT_REC_END)
			count[rec.type]++;
		off += rec.size;
	}
}

void image_load(struct image *img, const char *path, const char *xxh3)
{
	struct stat st;
	memset(img, 0, sizeof(*img));
	img->file = path;
	/* restore_fds() moves it above every fd number of the image */
	img->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (img->fd < 0)
		die("%s: %s", path, strerror(errno));
	if (fstat(img->fd, &st))
		die("%s: %s", path, strerror(errno));
	if ((uint64_t)st.st_size < CKPT_HEADER_SIZE)
		die("%s: truncated image", path);
	read_exact_at(img, &img->hdr, sizeof(img->hdr), 0);
	if (xxh3)		/* damage first: it explains any odd header */
		check_checksum(img, xxh3, st.st_size);
	check_header(img);
	unsigned count[CKPT_REC_END + 1] = { 0 };

	count_records(img, st.st_size, count);
	img->threads = arena_alloc((count[CKPT_REC_THREAD] + 1) * sizeof(*img->threads));
	img->vmas = arena_alloc((count[CKPT_REC_VMA] + 1) * sizeof(*img->vmas));
	img->fds = arena_alloc((count[CKPT_REC_FD] + 1) * sizeof(*img->fds));
	img->max_threads = count[CKPT_REC_THREAD];
	img->max_vmas = count[CKPT_REC_VMA];
	img->max_fds = count[CKPT_REC_FD];
	load_records(img, st.st_size);
	if (!img->proc || !img->nthreads)
		die("%s: image has no process or thread record", path);
}
