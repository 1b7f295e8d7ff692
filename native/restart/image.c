/*
 * Reading an image: header checks, the optional checksum, and
 * the records (everything but page data) into the arena.  All of it
 * happens before anything of the running process is changed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>
#include <zstd.h>
#include "fast_hash.h"
#include "restart.h"
#include "linux_compat.h"

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

/* An intact header of another format version is said so before the
 * checksum is checked: that version's blocks may have another size, and
 * its checksum would not match. */
static void refuse_other_version(struct image *img)
{
	struct ckpt_image_header h;
	uint64_t want;

	if (pread(img->fd, &h, sizeof(h), 0) != sizeof(h) || h.magic != CKPT_IMAGE_MAGIC)
		return;
	want = h.header_xxh;
	h.header_xxh = 0;
	if (XXH3_64bits(&h, sizeof(h)) == want && h.format_version != CKPT_IMAGE_VERSION)
		die("%s: image format version %u, this ckpt-restart reads %u", img->file,
		    h.format_version, CKPT_IMAGE_VERSION);
}

/* The blocks of one image, hashed by every CPU (helpers.c). */
struct block_hashing {
	const char *data;
	uint64_t size, nblocks;
	uint64_t *digests;
	const uint8_t *skip;		/* blocks not to hash, or NULL */
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
		if (!h->skip || !h->skip[i])
			h->digests[i] = fast_xxh3_64(h->data + off,
						     h->size - off < CKPT_CHECKSUM_BLOCK ?
						     h->size - off : CKPT_CHECKSUM_BLOCK);
	}
}

/* The image checksum of fd's size bytes, hashed straight from the page
 * cache through a temporary mapping; 0 or an errno. */
static int image_checksum(int fd, uint64_t size, uint64_t *xxh3)
{
	struct block_hashing h = { .size = size };
	void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);

	if (p == MAP_FAILED)
		return errno;
	madvise(p, size, MADV_SEQUENTIAL);	/* read ahead far, from a cold disk */
	h.data = p;
	h.nblocks = (size + CKPT_CHECKSUM_BLOCK - 1) / CKPT_CHECKSUM_BLOCK;
	h.digests = malloc(h.nblocks * sizeof(*h.digests) + 1);
	if (!h.digests)
		die("out of memory");
	helpers_run(hash_blocks, &h);
	munmap(p, size);
	*xxh3 = XXH3_64bits(h.digests, h.nblocks * sizeof(*h.digests));	/* x86: little-endian */
	free(h.digests);
	return 0;
}

static void check_checksum(struct image *img, uint64_t want, uint64_t size)
{
	uint64_t got;
	int err = image_checksum(img->fd, size, &got);

	if (err)
		die("%s: cannot map the image: %s", img->file, strerror(err));
	if (got != want)
		die("%s: image checksum mismatch (corrupt or truncated image)", img->file);
}

/*
 * <image>.sum: the checksum of each block, as the writer computed them;
 * their XXH3 is the image's, which the manifest gives.  NULL when there
 * is none (an older image) or it does not check out: then the whole
 * image is hashed now, as without it.
 */
static uint64_t *load_block_sums(const struct image *img, uint64_t want)
{
	uint64_t nblocks = img->nblocks;
	char path[PATH_MAX];
	uint64_t *sums;
	struct stat st;
	int fd, ok;

	if (snprintf(path, sizeof(path), "%s.sum", img->file) >= (int)sizeof(path))
		return NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return NULL;
	sums = arena_alloc(nblocks * sizeof(*sums) + 1);
	ok = !fstat(fd, &st) && S_ISREG(st.st_mode) &&
	     (uint64_t)st.st_size == nblocks * sizeof(*sums) &&
	     pread(fd, sums, st.st_size, 0) == st.st_size &&
	     XXH3_64bits(sums, st.st_size) == want;	/* x86: little-endian */
	close(fd);
	return ok ? sums : NULL;
}

/*
 * Which blocks hold nothing but the records of regions whose page data
 * the reader puts in place after the point of no return (memory.c): it
 * checks those as it reads them (pages.c), so that a restart reads the
 * image once.  Their record headers are checked then too; before, they
 * only place and size the regions, which the loader checked for sense.
 * Such records follow each other: a run of them, [lo, hi), covers the
 * blocks wholly inside it, of which the reader checks those it reads
 * page data of (a block of headers alone is checked here).
 */
static void mark_deferred_blocks(struct image *img, uint64_t size)
{
	uint8_t *has_data = arena_alloc(img->nblocks + 1);

	img->deferred = arena_alloc(img->nblocks + 1);
	for (unsigned i = 0; i < img->nvmas; i++) {
		const struct ckpt_vma *v = &img->vmas[i].v;

		if (region_read_by_pieces(&img->vmas[i]) && v->data_size)
			for (uint64_t b = v->data_offset / CKPT_CHECKSUM_BLOCK;
			     b * CKPT_CHECKSUM_BLOCK < v->data_offset + v->data_size; b++)
				has_data[b] = 1;
	}
	for (unsigned i = 0; i < img->nvmas;) {
		uint64_t lo, hi;

		if (!region_read_by_pieces(&img->vmas[i])) {
			i++;
			continue;
		}
		lo = img->vmas[i].record_start;
		hi = img->vmas[i].record_end;
		for (i++; i < img->nvmas && region_read_by_pieces(&img->vmas[i]) &&
			  img->vmas[i].record_start == hi; i++)
			hi = img->vmas[i].record_end;
		for (uint64_t b = (lo + CKPT_CHECKSUM_BLOCK - 1) / CKPT_CHECKSUM_BLOCK;
		     b < img->nblocks; b++) {
			uint64_t end = (b + 1) * CKPT_CHECKSUM_BLOCK;

			if ((end < size ? end : size) > hi)
				break;
			img->deferred[b] = has_data[b];
		}
	}
}

/* Before the point of no return: every block the reader does not check. */
static void check_blocks_not_deferred(struct image *img, uint64_t size)
{
	struct block_hashing h = { .size = size, .nblocks = img->nblocks, .skip = img->deferred };
	void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, img->fd, 0);

	if (p == MAP_FAILED)
		die("%s: cannot map the image: %s", img->file, strerror(errno));
	h.data = p;
	h.digests = arena_alloc(h.nblocks * sizeof(*h.digests) + 1);
	helpers_run(hash_blocks, &h);
	munmap(p, size);
	for (uint64_t i = 0; i < h.nblocks; i++)
		if (!img->deferred[i] && h.digests[i] != img->block_sums[i])
			die("%s: image checksum mismatch (corrupt or truncated image)", img->file);
}

/*
 * --stage-dir: this host may hold a node-local copy of the image, in
 * staged_dir under the same name.  Read from there when it is the same
 * image (size and checksum); returns whether it took the copy's fd.
 */
static int use_staged_copy(struct image *img, const char *staged_dir, uint64_t want,
			   uint64_t size)
{
	const char *base = strrchr(img->file, '/');
	char path[PATH_MAX];
	struct stat st;
	uint64_t got;
	int fd;

	if (snprintf(path, sizeof(path), "%s/%s", staged_dir, base ? base + 1 : img->file) >=
	    (int)sizeof(path))
		return 0;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return 0;	/* none here: another host's, or gone */
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != size ||
	    image_checksum(fd, size, &got) || got != want) {
		warn("%s: the staged copy does not check out: reading %s", path, img->file);
		close(fd);
		return 0;
	}
	close(img->fd);
	img->fd = fd;
	return 1;
}

static void *read_payload(struct image *img, size_t len, uint64_t off)
{
	char *p = arena_alloc(len + 1);

	read_exact_at(img, p, len, off);
	p[len] = '\0';
	return p;
}

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

#define PAGE_MASK_LOW ((uint64_t)CKPT_PAGE_SIZE - 1)
/* x86-64 user space with 4-level page tables: a region above is refused
 * here, not by mmap() after the point of no return */
#define USER_SPACE_END (1ULL << 47)

static int page_aligned(uint64_t x)
{
	return (x & PAGE_MASK_LOW) == 0;
}

/* Runs (or guard ranges) inside the region, in order, not overlapping;
 * returns their bytes, or -1.  Written to overflow nowhere. */
static int64_t check_runs(const struct ckpt_run *runs, uint64_t n, uint64_t len)
{
	uint64_t next = 0, bytes = 0;

	for (uint64_t i = 0; i < n; i++) {
		uint64_t off = runs[i].offset, pages = runs[i].npages;

		if (!page_aligned(off) || off < next || off >= len || pages == 0 ||
		    pages > (len - off) / CKPT_PAGE_SIZE)
			return -1;
		next = off + pages * CKPT_PAGE_SIZE;
		bytes += pages * CKPT_PAGE_SIZE;
	}
	return bytes;
}

/* The fixed part of a memory record, before its runs are read. */
/* Chunks of compressed page data (ckpt_image.h), 0 for raw page data. */
static uint64_t vma_chunks(const struct ckpt_vma *v)
{
	if (v->compression != CKPT_COMPRESS_ZSTD)
		return 0;
	return v->data_size / CKPT_CHUNK_SIZE + !!(v->data_size % CKPT_CHUNK_SIZE);
}

static void check_vma_fields(struct image *img, const struct ckpt_vma *v, uint64_t off,
			     uint64_t size)
{
	uint64_t meta_max = size - sizeof(*v);

	if (v->path_len > meta_max || v->path_len >= CKPT_PATH_MAX ||
	    v->nruns > (meta_max - v->path_len) / sizeof(struct ckpt_run) ||
	    v->nguards > (meta_max - v->path_len) / sizeof(struct ckpt_run) - v->nruns ||
	    v->nrefs > meta_max / sizeof(struct ckpt_page_ref))
		die("%s: corrupt memory record (lengths)", img->file);
	if (v->compression > CKPT_COMPRESS_ZSTD ||
	    (v->compression == CKPT_COMPRESS_NONE && v->stored_size != v->data_size) ||
	    (v->compression == CKPT_COMPRESS_ZSTD && !v->data_size) ||
	    vma_chunks(v) > (meta_max - v->path_len - (v->nruns + v->nguards) *
			     sizeof(struct ckpt_run)) / sizeof(struct ckpt_chunk))
		die("%s: corrupt memory record (compression)", img->file);
	if (v->end <= v->start || !page_aligned(v->start) || !page_aligned(v->end) ||
	    v->end > USER_SPACE_END)
		die("%s: corrupt memory record (range %#llx-%#llx)", img->file,
		    (unsigned long long)v->start, (unsigned long long)v->end);
	if (v->kind < CKPT_VMA_ANON || v->kind > CKPT_VMA_AIO_RING || v->shared > 1 ||
	    (v->prot & ~(uint32_t)(PROT_READ | PROT_WRITE | PROT_EXEC)) ||
	    (v->flags & ~(uint32_t)(CKPT_VMA_PAGES_ELSEWHERE | CKPT_VMA_FILE_END |
				   CKPT_VMA_FILE_PAGES)))
		die("%s: corrupt memory record (kind, protection or flags)", img->file);
	if (!page_aligned(v->pgoff) || v->pgoff > UINT64_MAX / 2 ||
	    v->sysv_size > UINT64_MAX / 2)
		die("%s: corrupt memory record (file offset)", img->file);
	/* page data: page-aligned, after the record's own fields, inside the record */
	if (v->data_offset < off || v->data_offset - off > size || v->stored_size > size ||
	    v->data_offset - off > size - v->stored_size || !page_aligned(v->data_offset) ||
	    v->data_offset - off < sizeof(*v) + v->path_len +
					   (v->nruns + v->nguards) * sizeof(struct ckpt_run) +
					   vma_chunks(v) * sizeof(struct ckpt_chunk) +
					   v->nrefs * sizeof(struct ckpt_page_ref))
		die("%s: corrupt memory record (page data)", img->file);
	/* only private memory read in place refers to earlier images */
	if (v->nrefs && v->kind != CKPT_VMA_ANON && v->kind != CKPT_VMA_HEAP &&
	    v->kind != CKPT_VMA_STACK && v->kind != CKPT_VMA_FILE)
		die("%s: corrupt memory record (pages of earlier images)", img->file);
}

/*
 * Pages held by earlier images (incremental checkpoints): inside the
 * region, in order, apart from each other, each inside its source as
 * that source is (its size checked when loaded).  The sources record may
 * come after the memory: checked once all records are in (check_refs).
 */
static void check_refs(struct image *img, const struct loaded_vma *lv)
{
	uint64_t next = 0, len = lv->v.end - lv->v.start;

	for (uint64_t i = 0; i < lv->v.nrefs; i++) {
		const struct ckpt_page_ref *r = &lv->refs[i];
		const struct loaded_source *src = r->source < img->nsources ?
						  &img->sources[r->source] : NULL;
		int bad = !src || !page_aligned(r->offset) || !page_aligned(r->len) || !r->len ||
			  r->offset < next || r->offset >= len || r->len > len - r->offset ||
			  r->off > src->s.size;

		if (!bad && !r->stored)
			bad = r->len > src->s.size - r->off;
		else if (!bad)
			bad = r->chunk_len > CKPT_CHUNK_SIZE || r->into > r->chunk_len ||
			      r->len > r->chunk_len - r->into ||
			      r->stored > ZSTD_COMPRESSBOUND(CKPT_CHUNK_SIZE) ||
			      r->stored > src->s.size - r->off;
		if (bad)
			die("%s: corrupt memory record (pages of earlier images at %#llx)", img->file,
			    (unsigned long long)lv->v.start);
		next = r->offset + r->len;
	}
}

/* The payload of a CKPT_REC_VMA or CKPT_REC_FILE_PAGES record into lv. */
static void parse_vma_record(struct image *img, struct loaded_vma *lv, uint64_t off,
			     uint64_t size)
{
	int64_t run_bytes;

	lv->record_start = off - sizeof(struct ckpt_record);
	lv->record_end = off + size;
	if (size < sizeof(lv->v))
		die("%s: corrupt memory record", img->file);
	read_exact_at(img, &lv->v, sizeof(lv->v), off);
	check_vma_fields(img, &lv->v, off, size);
	if (lv->v.start < CKPT_RESERVE_END && lv->v.end > CKPT_RESERVE_START &&
	    lv->v.kind != CKPT_VMA_VDSO)
		die("%s: a memory region overlaps the restart range", img->file);
	lv->path = read_payload(img, lv->v.path_len, off + sizeof(lv->v));
	lv->runs = read_payload(img, lv->v.nruns * sizeof(struct ckpt_run),
				off + sizeof(lv->v) + lv->v.path_len);
	lv->guards = read_payload(img, lv->v.nguards * sizeof(struct ckpt_run),
				  off + sizeof(lv->v) + lv->v.path_len +
				  lv->v.nruns * sizeof(struct ckpt_run));
	run_bytes = check_runs(lv->runs, lv->v.nruns, lv->v.end - lv->v.start);
	if (run_bytes < 0 || (uint64_t)run_bytes != lv->v.data_size)
		die("%s: corrupt memory record (runs of saved pages)", img->file);
	if (check_runs(lv->guards, lv->v.nguards, lv->v.end - lv->v.start) < 0)
		die("%s: corrupt memory record (guard pages)", img->file);
	lv->nchunks = vma_chunks(&lv->v);
	lv->chunks = read_payload(img, lv->nchunks * sizeof(struct ckpt_chunk),
				  off + sizeof(lv->v) + lv->v.path_len +
				  (lv->v.nruns + lv->v.nguards) * sizeof(struct ckpt_run));
	check_chunks(img, lv);
	lv->refs = read_payload(img, lv->v.nrefs * sizeof(struct ckpt_page_ref),
				off + sizeof(lv->v) + lv->v.path_len +
				(lv->v.nruns + lv->v.nguards) * sizeof(struct ckpt_run) +
				lv->nchunks * sizeof(struct ckpt_chunk));
}

static void load_vma(struct image *img, uint64_t off, uint64_t size)
{
	struct loaded_vma *lv;

	if (img->nvmas == img->max_vmas || img->nvmas == MAX_VMAS)
		die("%s: too many memory regions", img->file);
	lv = &img->vmas[img->nvmas++];
	parse_vma_record(img, lv, off, size);
	if (img->nvmas > 1 && lv->v.start < img->vmas[img->nvmas - 2].v.end)
		die("%s: corrupt memory record (regions out of order or overlapping)", img->file);
	if (lv->v.nguards && !guards_supported())
		die("%s: the process has guard pages (MADV_GUARD_INSTALL), which this kernel "
		    "cannot install (Linux 6.13 or later can)", img->file);
}

/* An unlinked file's pages under a private map (state/shm.c fills the
 * file with them): a memory record of a private map of an unlinked file,
 * its file's end known, nothing but pages. */
static void load_file_pages(struct image *img, uint64_t off, uint64_t size)
{
	struct loaded_vma *lv;

	if (img->nfile_pages == img->max_file_pages || img->nfile_pages == MAX_VMAS)
		die("%s: too many records of unlinked files' pages", img->file);
	lv = &img->file_pages[img->nfile_pages++];
	parse_vma_record(img, lv, off, size);
	/* the file is made as long as its end (pages past it fault) */
	if (lv->v.kind != CKPT_VMA_DELETED_FILE || !(lv->v.flags & CKPT_VMA_FILE_END) ||
	    !lv->v.shm_id || lv->v.nguards || lv->v.nrefs || lv->v.file_size < lv->v.pgoff ||
	    lv->v.file_size - lv->v.pgoff > lv->v.end - lv->v.start ||
	    (lv->v.nruns && lv->runs[lv->v.nruns - 1].offset +
				    lv->runs[lv->v.nruns - 1].npages * CKPT_PAGE_SIZE >
			    lv->v.file_size - lv->v.pgoff))
		die("%s: corrupt record of an unlinked file's pages", img->file);
}

/* The fixed part of an fd record: numbers and lengths used as indexes. */
static void check_fd_fields(struct image *img, const struct ckpt_fd *f)
{
	if (f->fd < 0 || f->fd >= (1 << 20) || f->dup_of < -1 || f->dup_of == f->fd)
		die("%s: corrupt fd record (fd %d, dup of %d)", img->file, f->fd, f->dup_of);
	if (f->kind < CKPT_FD_FILE || f->kind > CKPT_FD_INOTIFY || f->path_len >= CKPT_PATH_MAX)
		die("%s: corrupt fd record for fd %d (kind or path)", img->file, f->fd);
	if (f->sock_local.len > sizeof(f->sock_local.addr) ||
	    f->sock_peer.len > sizeof(f->sock_peer.addr) || f->nsock_opts > CKPT_SOCK_OPTS)
		die("%s: corrupt fd record for fd %d (socket addresses or options)", img->file, f->fd);
	for (unsigned i = 0; i < f->nsock_opts; i++)
		if (f->sock_opts[i].len > sizeof(f->sock_opts[i].value))
			die("%s: corrupt fd record for fd %d (socket option)", img->file, f->fd);
}

/* A socket's BPF filter follows its queue: data_size is the queue's
 * from here on. */
static void split_socket_filter(const struct image *img, struct loaded_fd *lf)
{
	uint64_t bytes = (uint64_t)lf->f.sock_filter_len * 8;	/* struct sock_filter */

	lf->sock_filter = NULL;
	if (lf->f.kind != CKPT_FD_SOCKET || !lf->f.sock_filter_len)
		return;
	if (lf->f.sock_filter_len > CKPT_SOCK_FILTER_MAX || bytes > lf->f.data_size)
		die("%s: corrupt fd record for fd %d (socket filter)", img->file, lf->f.fd);
	lf->f.data_size -= bytes;
	lf->sock_filter = lf->data + lf->f.data_size;
}

/* The payload of a CKPT_REC_FD or CKPT_REC_MQUEUE record into lf. */
static void parse_fd_record(struct image *img, uint64_t off, uint64_t size,
			    struct loaded_fd *lf)
{
	char *payload;

	if (size < sizeof(lf->f))
		die("%s: corrupt fd record", img->file);
	payload = read_payload(img, size, off);
	memcpy(&lf->f, payload, sizeof(lf->f));
	/* path and data fill the record exactly (subtracted: no overflow) */
	if (lf->f.path_len > size - sizeof(lf->f) ||
	    lf->f.data_size != size - sizeof(lf->f) - lf->f.path_len)
		die("%s: corrupt fd record", img->file);
	lf->path = arena_alloc(lf->f.path_len + 1);
	memcpy((char *)lf->path, payload + sizeof(lf->f), lf->f.path_len);
	((char *)lf->path)[lf->f.path_len] = '\0';
	lf->data = payload + sizeof(lf->f) + lf->f.path_len;
}

static void load_fd(struct image *img, uint64_t off, uint64_t size)
{
	struct loaded_fd *lf;

	if (img->nfds == img->max_fds || img->nfds == MAX_FDS)
		die("%s: too many file descriptors", img->file);
	lf = &img->fds[img->nfds++];
	parse_fd_record(img, off, size, lf);
	check_fd_fields(img, &lf->f);
	for (unsigned i = 0; i + 1 < img->nfds; i++)
		if (img->fds[i].f.fd == lf->f.fd)
			die("%s: corrupt fd records (fd %d twice)", img->file, lf->f.fd);
	split_socket_filter(img, lf);
}

/* A message queue known by its name alone: no fd, no socket fields. */
static void load_named_mqueue(struct image *img, uint64_t off, uint64_t size)
{
	struct loaded_fd *lf;

	if (img->nnamed_mqueues == img->max_named_mqueues)
		die("%s: corrupt image (records)", img->file);
	lf = &img->named_mqueues[img->nnamed_mqueues++];
	parse_fd_record(img, off, size, lf);
	if (lf->f.fd != -1 || lf->f.kind != CKPT_FD_MQUEUE || lf->f.dup_of != -1 ||
	    lf->f.path_len >= CKPT_PATH_MAX || lf->f.sock_filter_len || lf->f.value[3])
		die("%s: corrupt message queue record", img->file);
	lf->sock_filter = NULL;
}

/* The executable no name reaches: a deleted file's record, fd -1.  Its
 * bytes stay in the image (exe_data_off), copied from there. */
static void load_exe(struct image *img, uint64_t off, uint64_t size)
{
	struct loaded_fd *lf = arena_alloc(sizeof(*lf));

	if (img->exe)
		die("%s: corrupt image (two executables)", img->file);
	if (size < sizeof(lf->f))
		die("%s: corrupt executable record", img->file);
	read_exact_at(img, &lf->f, sizeof(lf->f), off);
	if (lf->f.fd != -1 || lf->f.kind != CKPT_FD_DELETED_FILE || lf->f.dup_of != -1 ||
	    lf->f.path_len >= CKPT_PATH_MAX || lf->f.sock_filter_len || !lf->f.object_id ||
	    lf->f.path_len > size - sizeof(lf->f) ||
	    lf->f.data_size != size - sizeof(lf->f) - lf->f.path_len)
		die("%s: corrupt executable record", img->file);
	lf->path = read_payload(img, lf->f.path_len, off + sizeof(lf->f));
	((char *)lf->path)[lf->f.path_len] = '\0';
	lf->data = NULL;
	lf->sock_filter = NULL;
	img->exe = lf;
	img->exe_data_off = off + sizeof(lf->f) + lf->f.path_len;
}

static int has_nul(const char *s, size_t len)
{
	return memchr(s, '\0', len) != NULL;
}

/* The process record: counts inside their arrays, strings ended, the mm
 * fields PR_SET_MM_MAP takes after the point of no return in order. */
static void check_process(struct image *img, const struct ckpt_process *p)
{
	if (p->auxv_words > CKPT_AUXV_WORDS || p->nzombies > CKPT_MAX_ZOMBIES ||
	    !has_nul(p->cwd, sizeof(p->cwd)) || !has_nul(p->exe, sizeof(p->exe)))
		die("%s: corrupt process record", img->file);
	if (p->start_code > p->end_code || p->start_data > p->end_data ||
	    p->start_brk > p->brk || p->arg_start > p->arg_end || p->env_start > p->env_end ||
	    p->end_code >= USER_SPACE_END || p->end_data >= USER_SPACE_END ||
	    p->brk >= USER_SPACE_END || p->start_stack >= USER_SPACE_END ||
	    p->arg_end >= USER_SPACE_END || p->env_end >= USER_SPACE_END)
		die("%s: corrupt process record (memory layout)", img->file);
}

static int has_thread(const struct image *img, int32_t tid)
{
	for (unsigned i = 0; i < img->nthreads; i++)
		if (img->threads[i].tid == tid)
			return 1;
	return 0;
}

/* POSIX timers: each id once, a notification restore_posix_timers makes,
 * a signal, and a thread of the process to signal. */
static void check_timers(const struct image *img)
{
	const struct ckpt_process *p = img->proc;

	if (p->ntimers > CKPT_MAX_TIMERS)
		die("%s: corrupt process record (%u timers)", img->file, p->ntimers);
	for (unsigned i = 0; i < p->ntimers; i++) {
		const struct ckpt_posix_timer *t = &p->timers[i];

		if (t->id < 0 || t->signo < 0 || t->signo >= CKPT_NSIG || t->interval_ns < 0 ||
		    t->value_ns < 0 || (t->notify != SIGEV_SIGNAL && t->notify != SIGEV_NONE &&
		    t->notify != SIGEV_THREAD_ID) ||
		    (t->notify == SIGEV_THREAD_ID && !has_thread(img, t->tid)))
			die("%s: corrupt POSIX timer record (timer %d)", img->file, t->id);
		for (unsigned j = 0; j < i; j++)
			if (p->timers[j].id == t->id)
				die("%s: corrupt process record (timer %d twice)", img->file, t->id);
	}
}

/* The main thread is there once, and the shim's restart info, written
 * after the memory is back, lies in a writable region of the image. */
static void check_threads_and_info(struct image *img)
{
	uint64_t info = img->hdr.restart_info, end = info + sizeof(struct ckpt_restart_info);
	unsigned leaders = 0;
	int inside = 0;

	for (unsigned i = 0; i < img->nthreads; i++) {
		if (img->threads[i].tid <= 0)
			die("%s: corrupt thread record (tid %d)", img->file, img->threads[i].tid);
		leaders += img->threads[i].tid == img->hdr.pid;
	}
	if (leaders != 1)
		die("%s: corrupt image (%u main threads for pid %d)", img->file, leaders,
		    img->hdr.pid);
	for (unsigned i = 0; i < img->nvmas && !inside; i++) {
		const struct ckpt_vma *v = &img->vmas[i].v;

		inside = info >= v->start && end > info && end <= v->end &&
			 (v->prot & PROT_WRITE) && v->kind != CKPT_VMA_VDSO;
	}
	if (!inside || info % _Alignof(struct ckpt_restart_info))
		die("%s: corrupt image header (restart info at %#llx is not in a writable region)",
		    img->file, (unsigned long long)info);
}

/* The siginfos of one queue of pending signals (queued_signals.c). */
static const struct ckpt_signal_queue *load_signal_queue(struct image *img, uint64_t off,
							 uint64_t size)
{
	const struct ckpt_signal_queue *q;
	const siginfo_t *si;

	if (size < sizeof(*q))
		die("%s: corrupt signal record", img->file);
	q = read_payload(img, size, off);
	si = (const siginfo_t *)(q + 1);
	if (q->tid < 0 || size != sizeof(*q) + (uint64_t)q->count * CKPT_SIGINFO_SIZE)
		die("%s: corrupt signal record", img->file);
	for (uint32_t i = 0; i < q->count; i++)
		if (si[i].si_signo <= 0 || si[i].si_signo >= CKPT_NSIG)
			die("%s: corrupt signal record (signal %d)", img->file, si[i].si_signo);
	return q;
}

/* A source's name: "ckpt-NNNN/<image>", a checkpoint of the same job. */
static int source_name_ok(const char *name)
{
	const char *slash = memchr(name, '/', CKPT_SOURCE_NAME_MAX);

	return slash && memchr(name, '\0', CKPT_SOURCE_NAME_MAX) && !strncmp(name, "ckpt-", 5) &&
	       strspn(name + 5, "0123456789") == (size_t)(slash - name - 5) &&
	       slash[1] && slash[1] != '.' && !strchr(slash + 1, '/');
}

/* The earlier images this one refers to, in the checkpoints beside its
 * own: each opened and checked whole against its checksum now, before
 * anything is changed. */
static void load_sources(struct image *img, uint64_t off, uint64_t size)
{
	const struct ckpt_source *src;
	const char *slash = strrchr(img->file, '/');
	int dir_len = slash ? (int)(slash - img->file) : 1;
	const char *dir = slash ? img->file : ".";

	if (img->peer)
		return;
	if (img->nsources || !size || size % sizeof(*src) ||
	    size / sizeof(*src) > MAX_SOURCES)
		die("%s: corrupt record of earlier images", img->file);
	src = read_payload(img, size, off);
	img->nsources = size / sizeof(*src);
	img->sources = arena_alloc(img->nsources * sizeof(*img->sources));
	for (unsigned i = 0; i < img->nsources; i++) {
		struct loaded_source *ls = &img->sources[i];
		struct image earlier = { .fd = -1 };
		struct stat st;
		char *path;

		ls->s = src[i];
		if (!source_name_ok(ls->s.name))
			die("%s: corrupt record of earlier images (a name)", img->file);
		path = arena_alloc(dir_len + strlen(ls->s.name) + 5);
		sprintf(path, "%.*s/../%s", dir_len, dir, ls->s.name);
		earlier.file = path;
		ls->fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
		if (ls->fd < 0)
			die("%s: an earlier checkpoint's image it refers to: %s: %s", img->file, path,
			    strerror(errno));
		if (fstat(ls->fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != ls->s.size)
			die("%s: an earlier checkpoint's image it refers to has changed: %s is not "
			    "the %llu-byte image it was", img->file, path,
			    (unsigned long long)ls->s.size);
		earlier.fd = ls->fd;
		check_checksum(&earlier, ls->s.xxh3, ls->s.size);
	}
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
			check_process(img, img->proc);
			break;
		case CKPT_REC_THREAD:
			if (rec.size != sizeof(struct ckpt_thread) || img->nthreads == img->max_threads)
				die("%s: corrupt thread record", img->file);
			read_exact_at(img, &img->threads[img->nthreads++], rec.size, off);
			break;
		case CKPT_REC_VMA:
			load_vma(img, off, rec.size);
			break;
		case CKPT_REC_FILE_PAGES:
			load_file_pages(img, off, rec.size);
			break;
		case CKPT_REC_FD:
			load_fd(img, off, rec.size);
			break;
		case CKPT_REC_MQUEUE:
			load_named_mqueue(img, off, rec.size);
			break;
		case CKPT_REC_EXE:
			load_exe(img, off, rec.size);
			break;
		case CKPT_REC_PLUGIN:
			break;		/* plugins keep their state in memory */
		case CKPT_REC_SYSV_SEM:
		case CKPT_REC_SYSV_MSG: {
			struct sysv_object *o = &img->sysv[img->nsysv];

			if (img->nsysv == img->max_sysv)
				die("%s: corrupt image (records)", img->file);
			*o = (struct sysv_object){ rec.type, rec.size, read_payload(img, rec.size, off) };
			sysv_ipc_check(img, o);
			img->nsysv++;
			break;
		}
		case CKPT_REC_SIGNALS:
			if (img->nsignal_queues == img->max_signal_queues)
				die("%s: corrupt image (records)", img->file);
			img->signal_queues[img->nsignal_queues++] = load_signal_queue(img, off, rec.size);
			break;
		case CKPT_REC_SOURCES:
			load_sources(img, off, rec.size);
			break;
		case CKPT_REC_AIO_REQUESTS:
			if (img->naio_requests || !rec.size ||
			    rec.size % sizeof(struct ckpt_aio_request))
				die("%s: corrupt record of AIO requests", img->file);
			img->aio_requests = read_payload(img, rec.size, off);
			img->naio_requests = rec.size / sizeof(struct ckpt_aio_request);
			break;
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
		if (rec.type <= CKPT_REC_LAST)
			count[rec.type]++;
		off += rec.size;
	}
}

static void load(struct image *img, const char *path, const char *xxh3, int peer,
		 const char *staged_dir)
{
	struct stat st;
	memset(img, 0, sizeof(*img));
	img->file = path;
	img->peer = peer;
	/* restore_fds() moves it above every fd number of the image */
	/* never through a symbolic link out of the checkpoint directory, and
	 * never blocked on a FIFO in the image's place */
	img->fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (img->fd < 0 && errno == ELOOP)
		die("%s: is a symbolic link, not an image", path);
	if (img->fd < 0)
		die("%s: %s", path, strerror(errno));
	if (fstat(img->fd, &st))
		die("%s: %s", path, strerror(errno));
	if (!S_ISREG(st.st_mode))
		die("%s: not a regular file", path);
	if ((uint64_t)st.st_size < CKPT_HEADER_SIZE)
		die("%s: truncated image", path);
	img->size = st.st_size;
	img->nblocks = (st.st_size + CKPT_CHECKSUM_BLOCK - 1) / CKPT_CHECKSUM_BLOCK;
	refuse_other_version(img);
	if (xxh3) {		/* damage first: it explains any odd header */
		uint64_t want = strtoull(xxh3, NULL, 16);

		if (staged_dir && use_staged_copy(img, staged_dir, want, st.st_size))
			;	/* checked whole */
		else if (peer || !(img->block_sums = load_block_sums(img, want)))
			check_checksum(img, want, st.st_size);
	}
	read_exact_at(img, &img->hdr, sizeof(img->hdr), 0);
	check_header(img);
	unsigned count[CKPT_REC_LAST + 1] = { 0 };

	count_records(img, st.st_size, count);
	img->threads = arena_alloc((count[CKPT_REC_THREAD] + 1) * sizeof(*img->threads));
	img->vmas = arena_alloc((count[CKPT_REC_VMA] + 1) * sizeof(*img->vmas));
	img->fds = arena_alloc((count[CKPT_REC_FD] + 1) * sizeof(*img->fds));
	img->max_threads = count[CKPT_REC_THREAD];
	img->max_vmas = count[CKPT_REC_VMA];
	img->file_pages = arena_alloc((count[CKPT_REC_FILE_PAGES] + 1) * sizeof(*img->file_pages));
	img->max_file_pages = count[CKPT_REC_FILE_PAGES];
	img->max_fds = count[CKPT_REC_FD];
	img->max_named_mqueues = count[CKPT_REC_MQUEUE];
	img->named_mqueues = arena_alloc((img->max_named_mqueues + 1) *
					 sizeof(*img->named_mqueues));
	img->max_sysv = count[CKPT_REC_SYSV_SEM] + count[CKPT_REC_SYSV_MSG];
	img->sysv = arena_alloc((img->max_sysv + 1) * sizeof(*img->sysv));
	img->max_signal_queues = count[CKPT_REC_SIGNALS];
	img->signal_queues = arena_alloc((img->max_signal_queues + 1) *
					 sizeof(*img->signal_queues));
	load_records(img, st.st_size);
	if (img->block_sums) {	/* before anything acts on the records */
		mark_deferred_blocks(img, st.st_size);
		check_blocks_not_deferred(img, st.st_size);
	}
	for (unsigned i = 0; i < img->nvmas && !peer; i++)
		check_refs(img, &img->vmas[i]);
	if (!img->proc || !img->nthreads)
		die("%s: image has no process or thread record", path);
	check_threads_and_info(img);
	check_timers(img);
}

/* staged_dir: where a node-local copy may be (--stage-dir), or NULL */
void image_load(struct image *img, const char *path, const char *xxh3, const char *staged_dir)
{
	load(img, path, xxh3, 0, staged_dir);
}

/* Another host's image: its records, never its memory. */
void image_load_peer(struct image *img, const char *path)
{
	load(img, path, NULL, 1, NULL);
}
