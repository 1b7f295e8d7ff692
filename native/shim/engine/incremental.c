/*
 * Incremental checkpoints (--incremental): a page is written only when it
 * changed since the job's previous checkpoint; the memory record refers
 * to the earlier image that holds it (struct ckpt_page_ref).  "Changed"
 * means another XXH3-128 at that address than the previous image's
 * sidecar (<image>.pages) lists: content, not write tracking, so a page
 * dropped and read back as zeros (MADV_DONTNEED, which leaves no dirty
 * bit) is never taken for unchanged.  The hashing is the writer's: in a
 * forked write, after the job resumed.
 *
 * Every sidecar lists each page its image saved, written or referred to,
 * with where it lies: an image refers straight to the image holding a
 * page, never through a chain of images.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>
#include "fast_hash.h"
#include "ckpt_io.h"
#include "shim.h"

#define MAX_SOURCES 64			/* bounds a chain: --full-every */
#define SIDECAR_BUF (1 << 20)
#define WINDOW_MAX 8192			/* pages of a window (state/memory.c) */
#define HASH_BATCH 64			/* pages a task takes at once */

struct increments {
	XXH3_state_t body_hash;		/* of the new sidecar; first: alignment */
	/* the previous image's sidecar, read whole */
	char *prev_file;
	size_t prev_file_size;
	const struct ckpt_page_loc *prev;
	uint64_t nprev, cursor;		/* pages come in address order */
	const struct ckpt_source *prev_sources;
	uint32_t nprev_sources;
	struct ckpt_source prev_self;	/* the previous image itself */
	uint32_t chain;
	XXH128_hash_t zero_hash;	/* of a page of zeros: such pages are not saved */
	/* this image's sources; source_of[k]: ours + 1 for the previous
	 * sidecar's source k, 0 while not used */
	struct ckpt_source sources[MAX_SOURCES];
	uint32_t nsources;
	uint32_t source_of[MAX_SOURCES + 1];
	/* the window being saved: its pages in order (a written one holds
	 * its place in the record's page data in `off` until placed) */
	struct ckpt_page_loc window[WINDOW_MAX];
	uint64_t nwindow;
	/* its candidate pages, hashed on every CPU */
	struct cpu_tasks *tasks;
	uint64_t start, npages_in, next;	/* next: atomic */
	uint64_t offset[WINDOW_MAX];
	XXH128_hash_t hash[WINDOW_MAX];
	struct ckpt_run kept[WINDOW_MAX / 2 + 1];
	/* the new sidecar */
	int fd;
	char tmp_name[200];
	uint64_t npages;
	size_t buflen;
	char buf[SIDECAR_BUF];
	int error;
	uint64_t own_bytes, referred_bytes;
};

static const char zero_page[CKPT_PAGE_SIZE];

static int sidecar_put(struct increments *inc, const void *p, size_t len)
{
	if (inc->error)
		return inc->error;
	XXH3_64bits_update(&inc->body_hash, p, len);
	if (inc->buflen + len > sizeof(inc->buf)) {
		inc->error = ckpt_write_all(inc->fd, inc->buf, inc->buflen);
		inc->buflen = 0;
		if (inc->error)
			return inc->error;
	}
	memcpy(inc->buf + inc->buflen, p, len);
	inc->buflen += len;
	return 0;
}

/* The previous sidecar, whole and checked: anything odd and this image is
 * a full one. */
static int load_previous(struct increments *inc, const char *parent_dir, const char *image)
{
	const struct ckpt_pages_header *h;
	char path[512];
	struct stat st;
	int fd, err = 0;

	if (snprintf(path, sizeof(path), "%s/%s.pages", parent_dir, image) >= (int)sizeof(path))
		return ENAMETOOLONG;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return errno;
	if (fstat(fd, &st) || (uint64_t)st.st_size < sizeof(*h)) {
		close(fd);
		return EINVAL;
	}
	inc->prev_file_size = st.st_size;
	inc->prev_file = scratch_map(st.st_size);
	if (!inc->prev_file)
		err = ENOMEM;
	else if (pread(fd, inc->prev_file, st.st_size, 0) != st.st_size)
		err = EIO;
	close(fd);
	if (err)
		return err;
	h = (const struct ckpt_pages_header *)inc->prev_file;
	if (h->magic != CKPT_PAGES_MAGIC || h->nsources > MAX_SOURCES - 1 ||
	    h->npages > (st.st_size - sizeof(*h)) / sizeof(struct ckpt_page_loc) ||
	    sizeof(*h) + h->npages * sizeof(struct ckpt_page_loc) +
		    h->nsources * sizeof(struct ckpt_source) != (uint64_t)st.st_size ||
	    XXH3_64bits(h + 1, st.st_size - sizeof(*h)) != h->body_xxh3)
		return EINVAL;
	inc->prev = (const struct ckpt_page_loc *)(h + 1);
	inc->nprev = h->npages;
	inc->prev_sources = (const struct ckpt_source *)(inc->prev + h->npages);
	inc->nprev_sources = h->nsources;
	for (uint64_t i = 0; i < inc->nprev; i++)
		if (inc->prev[i].source > inc->nprev_sources ||
		    (i && inc->prev[i].addr <= inc->prev[i - 1].addr))
			return EINVAL;
	for (uint32_t i = 0; i < inc->nprev_sources; i++)
		if (!memchr(inc->prev_sources[i].name, '\0', CKPT_SOURCE_NAME_MAX))
			return EINVAL;
	/* the image it describes is the one there */
	if (snprintf(path, sizeof(path), "%s/%s", parent_dir, image) >= (int)sizeof(path) ||
	    stat(path, &st) || (uint64_t)st.st_size != h->image_size)
		return ESTALE;
	{
		const char *base = strrchr(parent_dir, '/');

		base = base ? base + 1 : parent_dir;
		if (snprintf(inc->prev_self.name, sizeof(inc->prev_self.name), "%s/%s", base,
			     image) >= (int)sizeof(inc->prev_self.name))
			return ENAMETOOLONG;
	}
	inc->prev_self.size = h->image_size;
	inc->prev_self.xxh3 = h->image_xxh3;
	inc->chain = h->chain + 1;
	return 0;
}

/*
 * For the image `image` being written into dirfd; parent_dir: the
 * previous checkpoint's directory, or NULL for a full image.  A previous
 * sidecar that is missing or does not check out makes a full image.
 */
struct increments *increments_begin(int dirfd, const char *image, const char *parent_dir,
				    int *err)
{
	struct increments *inc = scratch_map(sizeof(*inc));

	*err = 0;
	if (!inc) {
		*err = ENOMEM;
		return NULL;
	}
	XXH3_64bits_reset(&inc->body_hash);
	inc->zero_hash = XXH3_128bits(zero_page, CKPT_PAGE_SIZE);
	inc->tasks = cpu_tasks_new(err);	/* none: hashed here alone */
	*err = 0;
	snprintf(inc->tmp_name, sizeof(inc->tmp_name), "%s.pages.tmp", image);
	inc->fd = openat(dirfd, inc->tmp_name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (inc->fd < 0) {
		*err = errno;
		cpu_tasks_free(inc->tasks);
		scratch_unmap(inc, sizeof(*inc));
		return NULL;
	}
	if (parent_dir) {
		int why = load_previous(inc, parent_dir, image);

		if (why) {
			shim_log("%s/%s.pages: %s: this image is a full one", parent_dir, image,
				 shim_strerror(why));
			inc->nprev = 0;
			inc->nprev_sources = 0;
			inc->chain = 0;
		}
	}
	/* the header's place: written last */
	{
		struct ckpt_pages_header h = { 0 };

		*err = ckpt_write_all(inc->fd, &h, sizeof(h));
	}
	if (*err) {
		increments_abort(inc, dirfd);
		return NULL;
	}
	return inc;
}

static void free_increments(struct increments *inc)
{
	cpu_tasks_free(inc->tasks);
	if (inc->prev_file)
		scratch_unmap(inc->prev_file, inc->prev_file_size);
	if (inc->fd >= 0)
		close(inc->fd);
	scratch_unmap(inc, sizeof(*inc));
}

void increments_abort(struct increments *inc, int dirfd)
{
	if (!inc)
		return;
	unlinkat(dirfd, inc->tmp_name, 0);
	free_increments(inc);
}

/* The previous image's entry for the page at addr, or NULL. */
static const struct ckpt_page_loc *previous_at(struct increments *inc, uint64_t addr)
{
	while (inc->cursor < inc->nprev && inc->prev[inc->cursor].addr < addr)
		inc->cursor++;
	if (inc->cursor < inc->nprev && inc->prev[inc->cursor].addr == addr)
		return &inc->prev[inc->cursor];
	return NULL;
}

/* Our source index (+ 1, as sidecars count) for the previous sidecar's
 * source k; 0 when our table is full. */
static uint32_t our_source(struct increments *inc, uint32_t k)
{
	if (!inc->source_of[k]) {
		if (inc->nsources == MAX_SOURCES)
			return 0;
		inc->sources[inc->nsources++] = k ? inc->prev_sources[k - 1] : inc->prev_self;
		inc->source_of[k] = inc->nsources;
	}
	return inc->source_of[k];
}

static int continues(const struct ckpt_page_ref *r, const struct ckpt_page_loc *l,
		     uint32_t source, uint64_t offset)
{
	if (r->source != source || r->offset + r->len != offset || r->stored != l->stored)
		return 0;
	if (!l->stored)		/* raw: the next bytes of the file */
		return r->off + r->len == l->off;
	return r->off == l->off && r->chunk_len == l->chunk_len && r->into + r->len == l->into;
}

static void refer(struct increments *inc, struct ckpt_page_ref *refs, uint64_t *nrefs,
		  uint64_t offset, const struct ckpt_page_loc *l, uint32_t source)
{
	struct ckpt_page_ref *last = *nrefs ? &refs[*nrefs - 1] : NULL;

	if (last && continues(last, l, source - 1, offset))
		last->len += CKPT_PAGE_SIZE;
	else
		refs[(*nrefs)++] = (struct ckpt_page_ref){
			.offset = offset, .len = CKPT_PAGE_SIZE, .off = l->off,
			.source = source - 1, .stored = l->stored, .into = l->into,
			.chunk_len = l->chunk_len };
	inc->referred_bytes += CKPT_PAGE_SIZE;
}

static void keep(struct increments *inc, long *nkept, uint64_t offset)
{
	struct ckpt_run *last = *nkept ? &inc->kept[*nkept - 1] : NULL;

	if (last && last->offset + last->npages * CKPT_PAGE_SIZE == offset)
		last->npages++;
	else
		inc->kept[(*nkept)++] = (struct ckpt_run){ offset, 1 };
}

static int hash_pages(void *arg)
{
	struct increments *inc = arg;

	for (;;) {
		uint64_t i = __atomic_fetch_add(&inc->next, HASH_BATCH, __ATOMIC_RELAXED);
		uint64_t end = i + HASH_BATCH < inc->npages_in ? i + HASH_BATCH : inc->npages_in;

		if (i >= inc->npages_in)
			return 0;
		for (; i < end; i++)
			inc->hash[i] = fast_xxh3_128((const void *)(inc->start + inc->offset[i]),
						     CKPT_PAGE_SIZE);
	}
}

static void hash_window(struct increments *inc, uint64_t start, const struct ckpt_run *runs,
			long nruns)
{
	uint64_t n = 0;

	for (long r = 0; r < nruns; r++)
		for (uint64_t p = 0; p < runs[r].npages; p++)
			inc->offset[n++] = runs[r].offset + p * CKPT_PAGE_SIZE;
	inc->start = start;
	inc->npages_in = n;
	inc->next = 0;
	cpu_tasks_run(inc->tasks, n / HASH_BATCH + 1, hash_pages, inc);
}

/*
 * The pages of the window at start that may be worth saving (runs, found
 * without reading them): those of zeros leave (drop_zero: anonymous
 * memory, where a page not saved is a zero page), those unchanged since
 * the previous image go to refs (WINDOW_MAX entries of room).  Every page
 * is read once, to hash it for the new sidecar.
 */
void increments_split(struct increments *inc, uint64_t start, struct ckpt_run *runs,
		      long *nruns, struct ckpt_page_ref *refs, uint64_t *nrefs, int drop_zero)
{
	uint64_t pos = 0;	/* in the record's page data */
	long nkept = 0;

	inc->nwindow = 0;
	*nrefs = 0;
	hash_window(inc, start, runs, *nruns);
	for (uint64_t i = 0; i < inc->npages_in; i++) {
		uint64_t offset = inc->offset[i];
		XXH128_hash_t h = inc->hash[i];
		const struct ckpt_page_loc *was;
		struct ckpt_page_loc *l;
		uint32_t source = 0;

		if (drop_zero && XXH128_isEqual(h, inc->zero_hash) &&
		    shim_page_is_zero((const void *)(start + offset)))
			continue;	/* like a page never touched */
		was = previous_at(inc, start + offset);
		l = &inc->window[inc->nwindow++];
		if (was && was->hash_lo == h.low64 && was->hash_hi == h.high64)
			source = our_source(inc, was->source);
		if (source) {
			*l = *was;
			l->source = source;
			refer(inc, refs, nrefs, offset, l, source);
		} else {
			*l = (struct ckpt_page_loc){ .off = pos };
			keep(inc, &nkept, offset);
			pos += CKPT_PAGE_SIZE;
			inc->own_bytes += CKPT_PAGE_SIZE;
		}
		l->addr = start + offset;
		l->hash_lo = h.low64;
		l->hash_hi = h.high64;
	}
	memcpy(runs, inc->kept, nkept * sizeof(*runs));
	*nruns = nkept;
}

/*
 * The window's page data now lies at data_offset, raw or in chunks: where
 * each written page is, and the window's pages into the new sidecar.
 */
int increments_place(struct increments *inc, uint64_t data_offset, uint64_t data_size,
		     const struct ckpt_chunk *chunks, uint64_t nchunks)
{
	uint64_t chunk = 0, chunk_off = data_offset;

	for (uint64_t i = 0; i < inc->nwindow; i++) {
		struct ckpt_page_loc *l = &inc->window[i];
		uint64_t pos = l->off;

		if (l->source)
			continue;
		if (!nchunks) {
			l->off = data_offset + pos;
			continue;
		}
		while (chunk + 1 < nchunks && pos >= (chunk + 1) * CKPT_CHUNK_SIZE)
			chunk_off += chunks[chunk++].stored;
		l->into = pos - chunk * CKPT_CHUNK_SIZE;
		if (chunks[chunk].format == CKPT_CHUNK_RAW) {
			l->off = chunk_off + l->into;
			l->into = 0;
		} else {
			uint64_t left = data_size - chunk * CKPT_CHUNK_SIZE;

			l->off = chunk_off;
			l->stored = chunks[chunk].stored;
			l->chunk_len = left < CKPT_CHUNK_SIZE ? left : CKPT_CHUNK_SIZE;
		}
	}
	inc->npages += inc->nwindow;
	return sidecar_put(inc, inc->window, inc->nwindow * sizeof(*inc->window));
}

/* The image's CKPT_REC_SOURCES record, when it refers to any. */
int increments_write_sources(struct increments *inc, struct image_writer *w)
{
	if (!inc || !inc->nsources)
		return 0;
	return iw_record(w, CKPT_REC_SOURCES, inc->sources,
			 inc->nsources * sizeof(struct ckpt_source));
}

/*
 * The image is complete (size bytes, checksum xxh3): the sidecar too,
 * renamed into place.  keys: what the coordinator learns (DONE keys).
 */
int increments_finish(struct increments *inc, int dirfd, const char *image, uint64_t size,
		      uint64_t xxh3, char *keys, size_t keys_size)
{
	struct ckpt_pages_header h = {
		.magic = CKPT_PAGES_MAGIC, .image_size = size, .image_xxh3 = xxh3,
		.nsources = inc->nsources, .chain = inc->nsources ? inc->chain : 0,
		.npages = inc->npages,
	};
	char name[200];
	size_t used;
	int err = sidecar_put(inc, inc->sources, inc->nsources * sizeof(*inc->sources));

	if (!err)
		err = ckpt_write_all(inc->fd, inc->buf, inc->buflen);
	h.body_xxh3 = XXH3_64bits_digest(&inc->body_hash);
	if (!err && pwrite(inc->fd, &h, sizeof(h), 0) != sizeof(h))
		err = errno ? errno : EIO;
	snprintf(name, sizeof(name), "%s.pages", image);
	if (!err && renameat(dirfd, inc->tmp_name, dirfd, name))
		err = errno;
	if (err) {
		increments_abort(inc, dirfd);
		return err;
	}
	used = snprintf(keys, keys_size, " own=%llu referred=%llu chain=%u sources=",
			(unsigned long long)inc->own_bytes,
			(unsigned long long)inc->referred_bytes, h.chain);
	/* the checkpoints (directories) this image needs, each once */
	for (uint32_t i = 0; i < inc->nsources && used < keys_size; i++) {
		const char *dir = inc->sources[i].name;
		size_t len = strcspn(dir, "/");
		int seen = 0;

		for (uint32_t j = 0; j < i && !seen; j++)
			seen = !strncmp(inc->sources[j].name, dir, len + 1);
		if (!seen)
			used += snprintf(keys + used, keys_size - used, "%s%.*s",
					 keys[used - 1] == '=' ? "" : ",", (int)len, dir);
	}
	free_increments(inc);
	return 0;
}
