/*
 * Memory records: one per /proc/self/maps region, split into windows of at
 * most WINDOW_PAGES so the buffers stay small.  /proc/self/pagemap tells
 * which pages exist: anonymous pages never touched, or all zero, are not
 * written; private file pages still identical to the file (not yet copied
 * on write) are not written either, restart maps the file again; those
 * of an unlinked file that nothing else brings back go to a record of
 * their own (CKPT_REC_FILE_PAGES), the file's, not the map's.  Guard
 * pages (MADV_GUARD_INSTALL: any access faults) are never read: pagemap
 * marks them, and they are saved as runs of their own, to be installed
 * again at restart.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <linux/magic.h>
#include <unistd.h>
#include "shim.h"

#define WINDOW_PAGES 8192UL		/* 32 MiB of address space: a compressed
					 * record is held in memory before it is
					 * written */
#define MAPS_MAX (8 << 20)

#define PM_PRESENT (1ULL << 63)
#define PM_SWAPPED (1ULL << 62)
#define PM_FILE (1ULL << 61)		/* file page or shared anonymous */
#define PM_GUARD (1ULL << 58)		/* a guard page (since Linux 6.14) */

struct region {
	uint64_t start, end, pgoff, inode, dev;
	uint32_t prot, shared, kind;
	const char *path;
};

/* File ranges [from, to) of an unlinked file that shared maps of the
 * process show: the file's own pages there come back with them. */
#define SHARED_SPANS 16

struct file_span {
	uint64_t from, to;
};

struct mem_saver {
	struct image_writer *w;
	const char *shared_key;
	const struct fd_table *fds;	/* as the process stopped */
	const struct shm_snapshot *shm;	/* a forked writer's shared memory */
	const struct vma_advice_table *advice;	/* as the process stopped */
	const char *copy;		/* the window's copy in it, or NULL */
	int pagemap_fd;
	uint64_t *pagemap;		/* WINDOW_PAGES entries */
	struct ckpt_run *runs;		/* WINDOW_PAGES / 2 + 1 entries */
	struct ckpt_run *guards;	/* as many */
	long nguards;			/* of the window find_runs looked at */
	uint64_t copied;		/* pages copied on write over an unlinked
					 * file, in the region being saved, that
					 * no shared map shows the file's page of */
	int file_back;			/* and that file comes back at restart,
					 * whole: an fd or a shared map has it */
	int file_pages;			/* saving the file's pages under the map
					 * (CKPT_REC_FILE_PAGES), not the map's */
	struct file_span spans[SHARED_SPANS];	/* of the region's file */
	unsigned nspans;
	struct compressor *z;		/* --compress, or NULL */
	struct increments *inc;		/* --incremental, or NULL */
	struct ckpt_page_ref *refs;	/* WINDOW_PAGES entries */
};

int shim_page_is_zero(const void *p)
{
	const uint64_t *q = p;

	for (size_t i = 0; i < CKPT_PAGE_SIZE / 8; i += 4)
		if (q[i] | q[i + 1] | q[i + 2] | q[i + 3])
			return 0;
	return 1;
}

static uint32_t parse_prot(const char *perms)
{
	return (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
	       (perms[2] == 'x' ? PROT_EXEC : 0);
}

static int is_deleted(const char *path)
{
	size_t n = strlen(path);

	return n > 10 && !strcmp(path + n - 10, " (deleted)");
}

/* tmpfs: a shared map of a file there is memory the job owns (POSIX shm,
 * MPI segments in /dev/shm), gone with the node: its pages are saved. */
static int in_memory_fs(const char *path)
{
	struct statfs sfs;

	return statfs(path, &sfs) == 0 && sfs.f_type == TMPFS_MAGIC;
}

static uint32_t classify(const struct region *r)
{
	const char *p = r->path;

	if (!strcmp(p, "[vdso]") || !strcmp(p, "[vvar]") || !strcmp(p, "[vvar_vclock]"))
		return CKPT_VMA_VDSO;
	if (!strcmp(p, "[heap]"))
		return CKPT_VMA_HEAP;
	if (!strcmp(p, "[stack]"))
		return CKPT_VMA_STACK;
	if (r->shared && !strncmp(p, "/SYSV", 5))
		return CKPT_VMA_SYSV_SHM;
	if (r->shared && !strcmp(p, "/[aio] (deleted)"))
		return CKPT_VMA_AIO_RING;
	if (r->shared && p[0] == '/' && r->inode && !is_deleted(p))
		/* saved like shared memory: scratch files may be gone at restart */
		return in_memory_fs(p) || shim_is_scratch_path(p) ?
			CKPT_VMA_SHARED_MEMFILE : CKPT_VMA_SHARED_FILE;
	if (r->shared)
		return CKPT_VMA_SHARED_ANON;
	if (p[0] == '/' && r->inode)
		return is_deleted(p) ? CKPT_VMA_DELETED_FILE : CKPT_VMA_FILE;
	return CKPT_VMA_ANON;
}

static int parse_maps_line(char *line, struct region *r);
static ssize_t read_maps(char *buf, size_t size);

/*
 * Shared anonymous memory and maps of unlinked files hold data this
 * process may never have touched (pagemap says "not present"), and a page
 * past the end of an unlinked file raises SIGBUS when read: such regions
 * are read through process_vm_readv, which fails cleanly instead.
 */
static int copied_kind(uint32_t kind)
{
	return kind == CKPT_VMA_SHARED_ANON || kind == CKPT_VMA_DELETED_FILE ||
	       kind == CKPT_VMA_SHARED_MEMFILE || kind == CKPT_VMA_SYSV_SHM ||
	       kind == CKPT_VMA_AIO_RING;
}

static int shared_memory_kind(uint32_t kind)
{
	return kind == CKPT_VMA_SHARED_ANON || kind == CKPT_VMA_SHARED_MEMFILE ||
	       kind == CKPT_VMA_SYSV_SHM;
}

/* The segment's inode, as /proc/self/maps shows it at addr. */
static uint64_t mapped_inode(uint64_t addr)
{
	char *buf = scratch_map(MAPS_MAX);
	uint64_t ino = 0;
	ssize_t n;

	if (!buf)
		return 0;
	n = ckpt_read_file("/proc/self/maps", buf, MAPS_MAX - 1);
	if (n > 0) {
		buf[n] = '\0';
		for (char *line = buf; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
			unsigned long long s, e, ino_l;

			if (sscanf(line, "%llx-%llx %*s %*x %*x:%*x %llu", &s, &e, &ino_l) == 3 &&
			    s == addr) {
				ino = ino_l;
				break;
			}
		}
	}
	scratch_unmap(buf, MAPS_MAX);
	return ino;
}

/*
 * Which System V segment a /SYSV<key> mapping is: the maps show its key
 * and inode, /proc/sysvipc/shm the ids.  Attaching each candidate for a
 * moment shows its inode.
 */
static int sysv_identify(const struct region *r, struct ckpt_vma *v)
{
	char *buf = scratch_map(MAPS_MAX);
	unsigned key = strtoul(r->path + 5, NULL, 16);
	int found = 0;
	ssize_t n;

	if (!buf)
		return ENOMEM;
	n = ckpt_read_file("/proc/sysvipc/shm", buf, MAPS_MAX - 1);
	buf[n > 0 ? n : 0] = '\0';
	for (char *line = strchr(buf, '\n'); line && !found; line = strchr(line + 1, '\n')) {
		int k, id;
		unsigned mode;
		unsigned long long size;
		void *at;

		/* a removed segment (IPC_RMID, still attached) has key 0 */
		if (sscanf(line, " %d %d %o %llu", &k, &id, &mode, &size) != 4 ||
		    ((unsigned)k != key && k != 0))
			continue;
		at = shim_shmat(id, NULL, SHM_RDONLY);
		if (at == (void *)-1)
			continue;
		if (mapped_inode((uint64_t)at) == r->inode) {
			*v = (struct ckpt_vma){ .sysv_id = id, .sysv_key = k, .sysv_mode = mode,
						.sysv_size = size };
			found = 1;
		}
		shim_shmdt(at);
	}
	scratch_unmap(buf, MAPS_MAX);
	return found ? 0 : ENOENT;
}

static ssize_t copy_self(void *dst, uint64_t addr, size_t len)
{
	struct iovec local = { dst, len }, remote = { (void *)addr, len };

	return process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
}

/* A page of a private file map that the process wrote: anonymous now. */
static int copied_on_write(uint64_t pm)
{
	return (pm & PM_SWAPPED) || ((pm & PM_PRESENT) && !(pm & PM_FILE));
}

static int wants_page(uint32_t kind, uint64_t pm, const void *addr, int readable)
{
	if (copied_kind(kind)) {
		uint64_t page[CKPT_PAGE_SIZE / 8];
		unsigned char in_core = 1;

		/* a page copied on write over an unlinked file: the restart's
		 * stand-in of the file may hold other bytes there, even zeros */
		if (kind == CKPT_VMA_DELETED_FILE && copied_on_write(pm))
			return copy_self(page, (uint64_t)addr, sizeof(page)) == sizeof(page);

		/* a hole of shared memory would be allocated by reading it;
		 * mincore sees pages any process touched */
		if (shared_memory_kind(kind) &&
		    (mincore((void *)addr, CKPT_PAGE_SIZE, &in_core) || !in_core))
			return 0;
		return copy_self(page, (uint64_t)addr, sizeof(page)) == sizeof(page) &&
		       !shim_page_is_zero(page);
	}
	if (!(pm & (PM_PRESENT | PM_SWAPPED)))
		return 0;
	if (kind == CKPT_VMA_FILE)	/* unchanged file pages come from the file */
		return (pm & PM_SWAPPED) || !(pm & PM_FILE);
	return !readable || !shim_page_is_zero(addr);
}

/* Page data of a copied region, through a bounce buffer. */
static int write_copied(struct image_writer *w, uint64_t addr, size_t len)
{
	uint64_t page[CKPT_PAGE_SIZE / 8];
	int err = 0;

	for (size_t off = 0; !err && off < len; off += CKPT_PAGE_SIZE) {
		if (copy_self(page, addr + off, sizeof(page)) != sizeof(page))
			memset(page, 0, sizeof(page));	/* gone meanwhile */
		err = iw_append(w, page, sizeof(page));
	}
	return err;
}

/* Whether a shared map of the process shows the file range [from, to). */
static int spans_cover(const struct mem_saver *s, uint64_t from, uint64_t to)
{
	for (int moved = 1; moved && from < to;) {
		moved = 0;
		for (unsigned i = 0; i < s->nspans; i++)
			if (s->spans[i].from <= from && s->spans[i].to > from) {
				from = s->spans[i].to;
				moved = 1;
			}
	}
	return from >= to;
}

/*
 * A page of a private map of an unlinked file is the process's own once
 * copied on write; the others are the file's (pagemap: a file page),
 * and stay so at restart, under the map.  Under an own page, the file's
 * bytes are out of reach (map_files needs privileges), unless a shared
 * map shows them: counted, for warn_lost_file_bytes.
 */
static int own_page(struct mem_saver *s, const struct region *r, uint64_t pm, uint64_t addr)
{
	uint64_t off = r->pgoff + (addr - r->start);

	if (!copied_on_write(pm))
		return 0;
	if (!spans_cover(s, off, off + CKPT_PAGE_SIZE))
		s->copied++;
	return wants_page(r->kind, pm, (void *)addr, 1);
}

/* The file's page under a private map (not copied on write), to make the
 * file again: worth saving unless zero, as a new file reads there. */
static int file_page_wanted(uint64_t pm, uint64_t addr)
{
	uint64_t page[CKPT_PAGE_SIZE / 8];

	return !copied_on_write(pm) && copy_self(page, addr, sizeof(page)) == sizeof(page) &&
	       !shim_page_is_zero(page);
}

static void add_to_runs(struct ckpt_run *runs, long *n, uint64_t offset)
{
	if (*n && runs[*n - 1].offset + runs[*n - 1].npages * CKPT_PAGE_SIZE == offset)
		runs[*n - 1].npages++;
	else
		runs[(*n)++] = (struct ckpt_run){ offset, 1 };
}

/* Pages of [start, end) worth saving, as runs; returns the run count.
 * Its guard pages go to s->guards.  look: read the pages to leave zero
 * ones out (an incremental window does so as it hashes them). */
static long find_runs(struct mem_saver *s, const struct region *r, uint64_t start,
		      uint64_t end, int look)
{
	uint64_t npages = (end - start) / CKPT_PAGE_SIZE;
	ssize_t want = npages * 8;
	long nruns = 0;

	s->nguards = 0;
	if (pread(s->pagemap_fd, s->pagemap, want, start / CKPT_PAGE_SIZE * 8) != want)
		return -EIO;
	for (uint64_t i = 0; i < npages; i++) {
		uint64_t addr = start + i * CKPT_PAGE_SIZE;

		if (s->pagemap[i] & PM_GUARD) {
			if (!s->file_pages)
				add_to_runs(s->guards, &s->nguards, addr - start);
		} else if (s->file_pages ? file_page_wanted(s->pagemap[i], addr) :
			   r->kind == CKPT_VMA_DELETED_FILE ? own_page(s, r, s->pagemap[i], addr) :
			   s->copy ? !shim_page_is_zero(s->copy + (addr - start)) :
			   wants_page(r->kind, s->pagemap[i], (void *)addr, look))
			add_to_runs(s->runs, &nruns, addr - start);
	}
	return nruns;
}

/* Only the guard pages of [start, end), for regions whose pages are not
 * saved here: page tables are each process's own. */
static int find_guards(struct mem_saver *s, uint64_t start, uint64_t end)
{
	uint64_t npages = (end - start) / CKPT_PAGE_SIZE;
	ssize_t want = npages * 8;

	s->nguards = 0;
	if (pread(s->pagemap_fd, s->pagemap, want, start / CKPT_PAGE_SIZE * 8) != want)
		return EIO;
	for (uint64_t i = 0; i < npages; i++)
		if (s->pagemap[i] & PM_GUARD)
			add_to_runs(s->guards, &s->nguards, i * CKPT_PAGE_SIZE);
	return 0;
}

static int any_page_present(struct mem_saver *s, uint64_t start, uint64_t end)
{
	uint64_t npages = (end - start) / CKPT_PAGE_SIZE;
	ssize_t want = npages * 8;

	if (pread(s->pagemap_fd, s->pagemap, want, start / CKPT_PAGE_SIZE * 8) != want)
		return 1;
	for (uint64_t i = 0; i < npages; i++)
		if ((s->pagemap[i] & (PM_PRESENT | PM_SWAPPED)) && !(s->pagemap[i] & PM_GUARD))
			return 1;
	return 0;
}

/*
 * Where the unlinked file behind [start, end) ends, as a file offset
 * rounded up to a page: the end of the last page that can be read (past
 * the file's end a read faults, process_vm_readv fails).  Its stat is out
 * of reach without privileges (map_files), its pages are not.
 */
static uint64_t deleted_file_end(const struct region *r, uint64_t start, uint64_t end)
{
	char byte;

	for (uint64_t a = end; a > start; a -= CKPT_PAGE_SIZE)
		if (copy_self(&byte, a - CKPT_PAGE_SIZE, 1) == 1)
			return r->pgoff + (a - r->start);
	return r->pgoff + (start - r->start);
}

static void file_identity(const struct region *r, struct ckpt_vma *v)
{
	struct stat st;

	if (r->kind != CKPT_VMA_FILE && r->kind != CKPT_VMA_SHARED_FILE &&
	    r->kind != CKPT_VMA_SHARED_MEMFILE)
		return;
	if (stat(r->path, &st) == 0 && st.st_ino == r->inode) {
		v->file_size = st.st_size;
		v->file_mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
	}
}

/*
 * The same range of a shared memory object, mapped by several processes,
 * is saved once: the first to claim it (through the coordinator) writes
 * its pages.  Whether another process owns it.
 */
static int saved_elsewhere(const struct mem_saver *s, const struct ckpt_vma *v)
{
	char key[256], value[16], owner[64];

	if (!s->shared_key || !v->shm_id || !shared_memory_kind(v->kind))
		return 0;
	snprintf(key, sizeof(key), "%s:%llx:%llx:%llx", s->shared_key,
		 (unsigned long long)v->shm_id, (unsigned long long)v->pgoff,
		 (unsigned long long)(v->end - v->start));
	snprintf(value, sizeof(value), "%d", getpid());
	return kv_claim(key, value, owner, sizeof(owner)) == EEXIST && atoi(owner) != getpid();
}

/* Whether another process saves this window: a forked writer's parent
 * asked before the fork (snapshot_shared_memory). */
static int window_elsewhere(struct mem_saver *s, const struct ckpt_vma *v)
{
	const struct shm_window *w = shm_snapshot_find(s->shm, v->start, v->end);

	s->copy = w ? w->copy : NULL;
	return w ? w->elsewhere : saved_elsewhere(s, v);
}

/* The page data of one window, as the compressor asks for it. */
struct window_data {
	const struct mem_saver *s;
	const struct region *r;
	uint64_t start;
	long nruns;
	int steady;		/* not our own memory, which changes as we go */
};

/* Bytes [off, off + len) of the window's runs, laid end to end: in place
 * when one run holds them and they read as steady memory (zstd reads its
 * input more than once), else copied to buf; called on every compressing
 * CPU at once. */
static const void *gather_runs(void *p, uint64_t off, size_t len, void *buf)
{
	const struct window_data *d = p;
	const struct mem_saver *s = d->s;
	uint64_t pos = 0;
	char *out = buf;

	for (long i = 0; len && i < d->nruns; i++) {
		uint64_t run_len = s->runs[i].npages * CKPT_PAGE_SIZE;
		uint64_t skip, n, addr;

		if (off >= pos + run_len) {
			pos += run_len;
			continue;
		}
		skip = off - pos;
		n = run_len - skip < len ? run_len - skip : len;
		addr = d->start + s->runs[i].offset + skip;
		if (out == buf && n == len && d->steady && (s->copy || !copied_kind(d->r->kind)))
			return s->copy ? s->copy + (addr - d->start) : (const void *)addr;
		if (s->copy)
			memcpy(out, s->copy + (addr - d->start), n);
		else if (copied_kind(d->r->kind)) {
			if (copy_self(out, addr, n) != (ssize_t)n)
				memset(out, 0, n);	/* gone meanwhile */
		} else
			memcpy(out, (const void *)addr, n);
		out += n;
		off += n;
		len -= n;
		pos += run_len;
	}
	return len ? NULL : buf;
}

static int write_window_data(struct mem_saver *s, const struct region *r, uint64_t start,
			     uint64_t end, long nruns, uint64_t nchunks)
{
	/* our own stack and TLS change as we go: copy them, then hash */
	int ours = checkpointer_memory(start, end);
	int err = 0;

	if (nchunks) {
		compress_write_later(s->z);
		return 0;
	}
	for (long i = 0; !err && i < nruns; i++) {
		void *p = (void *)(start + s->runs[i].offset);
		size_t len = s->runs[i].npages * CKPT_PAGE_SIZE;

		if (s->copy)
			err = iw_direct(s->w, s->copy + s->runs[i].offset, len);
		else if (copied_kind(r->kind))
			err = write_copied(s->w, (uint64_t)p, len);
		else
			err = ours ? iw_append(s->w, p, len) : iw_direct(s->w, p, len);
	}
	return err;
}

/* Private memory read in place (not our own, which changes as we go):
 * its unchanged pages may be referred to an earlier image. */
static int incremental_window(const struct mem_saver *s, const struct region *r,
			      uint64_t start, uint64_t end)
{
	return s->inc && !s->copy && !checkpointer_memory(start, end) &&
	       (r->kind == CKPT_VMA_ANON || r->kind == CKPT_VMA_HEAP ||
		r->kind == CKPT_VMA_STACK || r->kind == CKPT_VMA_FILE);
}

static int save_window(struct mem_saver *s, const struct region *r, uint64_t start,
		       uint64_t end)
{
	struct ckpt_vma v = {
		.start = start, .end = end, .prot = r->prot, .shared = r->shared,
		.kind = r->kind, .path_len = strlen(r->path),
		.pgoff = r->pgoff + (start - r->start),
		.advice = vma_advice_at(s->advice, start),
		/* an unlinked file's too: the restart maps the same object if
		 * an fd or a shared map brings it back */
		.shm_id = shared_memory_kind(r->kind) || r->kind == CKPT_VMA_DELETED_FILE ?
			shim_object_id(r->dev, r->inode) : 0,
	};
	struct ckpt_vma sysv;
	int readable = r->prot & PROT_READ;
	int unprotected = 0;
	const struct ckpt_chunk *chunks = NULL;
	uint64_t nchunks = 0, nrefs = 0;
	long nruns = 0;
	int incremental = 0;
	size_t payload;
	int err;

	s->nguards = 0;
	if (window_elsewhere(s, &v)) {
		v.flags |= CKPT_VMA_PAGES_ELSEWHERE;
		err = find_guards(s, start, end);
		if (err)
			return err;
	} else if (r->kind == CKPT_VMA_SHARED_FILE) {
		err = find_guards(s, start, end);
		if (err)
			return err;
	} else if (r->kind != CKPT_VMA_VDSO) {
		if (!readable && (copied_kind(r->kind) || any_page_present(s, start, end))) {
			/* a PROT_NONE or write-only region holding data */
			if (shim_mprotect((void *)start, end - start, r->prot | PROT_READ))
				return errno;
			unprotected = readable = 1;
		}
		incremental = incremental_window(s, r, start, end);
		nruns = find_runs(s, r, start, end, readable && !incremental);
		if (nruns < 0)
			return -nruns;
		if (incremental)
			/* a private file map's page not saved is the file's */
			increments_split(s->inc, start, s->runs, &nruns, s->refs, &nrefs,
					 r->kind != CKPT_VMA_FILE);
	}
	file_identity(r, &v);
	if (r->kind == CKPT_VMA_DELETED_FILE) {
		v.file_size = deleted_file_end(r, start, end);
		/* the file comes back: from an fd, a shared map, or the file's
		 * pages saved here (save_file_pages) */
		v.flags |= CKPT_VMA_FILE_END | CKPT_VMA_FILE_PAGES;
	}
	if (r->kind == CKPT_VMA_SYSV_SHM) {
		err = sysv_identify(r, &sysv);
		if (err)
			return err;
		v.sysv_id = sysv.sysv_id;
		v.sysv_key = sysv.sysv_key;
		v.sysv_mode = sysv.sysv_mode;
		v.sysv_size = sysv.sysv_size;
	}
	v.nruns = nruns;
	v.nguards = s->nguards;
	v.nrefs = nrefs;
	for (long i = 0; i < nruns; i++)
		v.data_size += s->runs[i].npages * CKPT_PAGE_SIZE;
	{
		struct window_data d = { s, r, start, nruns, !checkpointer_memory(start, end) };

		err = compress_record(s->z, s->w, v.data_size, gather_runs, &d, &chunks,
				      &nchunks, &v.stored_size);
		if (err)
			goto out;
		v.compression = nchunks ? CKPT_COMPRESS_ZSTD : CKPT_COMPRESS_NONE;
	}

	payload = sizeof(v) + v.path_len + (nruns + v.nguards) * sizeof(struct ckpt_run) +
		  nchunks * sizeof(struct ckpt_chunk) + nrefs * sizeof(struct ckpt_page_ref);
	/* data starts at the first page boundary after the payload */
	v.data_offset = (iw_offset(s->w) + sizeof(struct ckpt_record) + payload +
			 CKPT_PAGE_SIZE - 1) & ~(uint64_t)(CKPT_PAGE_SIZE - 1);
	{
		uint64_t pad = v.data_offset - (iw_offset(s->w) + sizeof(struct ckpt_record) + payload);
		struct ckpt_record rec = { .type = s->file_pages ? CKPT_REC_FILE_PAGES : CKPT_REC_VMA,
					   .size = payload + pad + v.stored_size };

		iw_append(s->w, &rec, sizeof(rec));
		iw_append(s->w, &v, sizeof(v));
		iw_append(s->w, r->path, v.path_len);
		iw_append(s->w, s->runs, nruns * sizeof(struct ckpt_run));
		iw_append(s->w, s->guards, v.nguards * sizeof(struct ckpt_run));
		iw_append(s->w, chunks, nchunks * sizeof(struct ckpt_chunk));
		iw_append(s->w, s->refs, nrefs * sizeof(struct ckpt_page_ref));
		err = iw_pad_to_page(s->w);
	}
	if (!err && incremental)
		err = increments_place(s->inc, v.data_offset, v.data_size, chunks, nchunks);
	if (!err)
		err = write_window_data(s, r, start, end, nruns, nchunks);
out:
	if (unprotected && shim_mprotect((void *)start, end - start, r->prot) && !err)
		err = errno;
	return err;
}

/*
 * Under pages copied on write, the bytes of an unlinked file nobody holds
 * open are out of reach unprivileged (/proc/self/map_files needs
 * CAP_CHECKPOINT_RESTORE): the restart has the process's bytes, but a page
 * it drops later (MADV_DONTNEED) reads as zeros, not as the file's.
 */
static void warn_lost_file_bytes(const struct region *r, uint64_t copied)
{
	ckpt_warn("private map %llx-%llx of unlinked %s: the file is not open: after "
		  "restart, its copied-on-write pages (%llu) read as zeros, not as the "
		  "file's bytes, once dropped (MADV_DONTNEED)",
		  (unsigned long long)r->start, (unsigned long long)r->end, r->path,
		  (unsigned long long)copied);
}

/*
 * The file ranges of r's unlinked file that shared maps of the process
 * show: the restart makes the file again from them (restart/state/shm.c).
 */
static void find_shared_spans(struct mem_saver *s, const struct region *r)
{
	char *buf = scratch_map(MAPS_MAX);
	ssize_t n = buf ? read_maps(buf, MAPS_MAX) : -1;

	s->nspans = 0;
	for (char *line = buf, *nl; n > 0 && s->nspans < SHARED_SPANS && *line; line = nl + 1) {
		struct region m;

		nl = strchr(line, '\n');
		if (!nl)
			break;
		*nl = '\0';
		if (!parse_maps_line(line, &m) && m.shared && m.dev == r->dev && m.inode == r->inode)
			s->spans[s->nspans++] = (struct file_span){ m.pgoff,
								    m.pgoff + (m.end - m.start) };
	}
	if (buf)
		scratch_unmap(buf, MAPS_MAX);
}

/* Whether the unlinked file behind a private map comes back at restart,
 * whole where the map shows it (pair of deleted_file_object,
 * restart/state/memory.c): an fd of the process has it (its contents are
 * saved with it), or shared maps of its range do.  Else the file's pages
 * under the map are saved (save_file_pages). */
static int file_comes_back(struct mem_saver *s, const struct region *r)
{
	find_shared_spans(s, r);
	return fds_hold_deleted(s->fds, r->dev, r->inode) ||
	       spans_cover(s, r->pgoff, r->pgoff + (r->end - r->start));
}

/* The windows of [r->start, r->end), around the scratch buffers that may
 * hide inside. */
static int save_windows(struct mem_saver *s, struct region *r)
{
	uint64_t step = WINDOW_PAGES * CKPT_PAGE_SIZE;
	uint64_t a = r->start;
	int err = 0;

	while (!err && a < r->end) {
		uint64_t until, end;

		if (scratch_at(a, &until)) {
			a = until;
			continue;
		}
		end = a + step;
		if (end > r->end)
			end = r->end;
		if (end > until)
			end = until;
		err = save_window(s, r, a, end);
		a = end;
	}
	return err;
}

/*
 * The pages of the unlinked file under a private map that no fd of the
 * process holds and no shared map shows: the ones the process did not
 * copy on write are the file's, and come back as the file's (a file made
 * again once for the job, that every private map of it maps), so that a
 * later write to the file (through another process's fd or shared map)
 * shows in them, as it did.
 */
static int save_file_pages(struct mem_saver *s, struct region *r)
{
	int err;

	s->file_pages = 1;
	err = save_windows(s, r);
	s->file_pages = 0;
	return err;
}

static int save_region(struct mem_saver *s, struct region *r)
{
	int err;

	r->kind = classify(r);
	s->copied = 0;
	s->nspans = 0;
	s->file_back = r->kind == CKPT_VMA_DELETED_FILE && file_comes_back(s, r);
	if (r->kind == CKPT_VMA_VDSO)
		return save_window(s, r, r->start, r->end);
	err = save_windows(s, r);
	if (!err && r->kind == CKPT_VMA_DELETED_FILE && !s->file_back)
		err = save_file_pages(s, r);
	if (!err && s->copied && !s->file_back && !fds_hold(s->fds, r->dev, r->inode))
		warn_lost_file_bytes(r, s->copied);
	return err;
}

static int skip_region(const struct region *r)
{
	if (!strcmp(r->path, "[vsyscall]"))
		return 1;
	return r->start >= CKPT_RESERVE_START && r->end <= CKPT_RESERVE_END;
}

/* Parse one line of /proc/self/maps in place. */
static int parse_maps_line(char *line, struct region *r)
{
	char perms[8];
	unsigned long long start, end, pgoff, inode;
	unsigned maj, min;
	int pos = 0;

	if (sscanf(line, "%llx-%llx %7s %llx %x:%x %llu %n", &start, &end, perms,
		   &pgoff, &maj, &min, &inode, &pos) < 7)
		return EIO;
	r->dev = makedev(maj, min);
	r->start = start;
	r->end = end;
	r->pgoff = pgoff;
	r->inode = inode;
	r->prot = parse_prot(perms);
	r->shared = perms[3] == 's';
	r->path = pos ? line + pos : "";
	return 0;
}

static ssize_t read_maps(char *buf, size_t size)
{
	ssize_t len = ckpt_read_file("/proc/self/maps", buf, size - 1);

	if (len < 0)
		return len;
	if ((size_t)len >= size - 1)
		return -E2BIG;
	buf[len] = '\0';
	return len;
}

/*
 * Memory no image can hold, found before anything is written: a packet
 * socket's mmap ring (the kernel writes frames there; a restored copy
 * would be memory nobody writes).  0, or ENOTSUP with why.
 */
int memory_unsupported(char *why, size_t why_size)
{
	char *maps = scratch_map(MAPS_MAX);
	ssize_t len = maps ? read_maps(maps, MAPS_MAX) : -ENOMEM;
	const char *ring = len > 0 ? strstr(maps, " socket:[") : NULL;
	int err = 0;

	if (ring) {
		const char *line = ring;

		while (line > maps && line[-1] != '\n')
			line--;
		snprintf(why, why_size, "a socket's ring buffer is mapped (%.*s): packet socket "
			 "rings (PACKET_RX_RING/TX_RING) are not supported",
			 (int)(strcspn(line, "\n")), line);
		err = ENOTSUP;
	}
	if (maps)
		scratch_unmap(maps, MAPS_MAX);
	return err;
}

int save_memory(struct image_writer *w, const char *shared_key, const struct fd_table *fds,
		const struct shm_snapshot *shm, const struct vma_advice_table *advice,
		int compression, struct increments *inc)
{
	struct mem_saver s = { .w = w, .shared_key = shared_key, .fds = fds, .shm = shm,
			       .advice = advice, .inc = inc };
	size_t refs_size = WINDOW_PAGES * sizeof(struct ckpt_page_ref);
	char *maps = scratch_map(MAPS_MAX);
	size_t pm_size = WINDOW_PAGES * 8;
	size_t runs_size = (WINDOW_PAGES / 2 + 1) * sizeof(struct ckpt_run);
	ssize_t len;
	int err = 0;

	s.pagemap = scratch_map(pm_size);
	s.runs = scratch_map(runs_size);
	s.guards = scratch_map(runs_size);
	s.refs = inc ? scratch_map(refs_size) : NULL;
	s.pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	s.z = compressor_new(compression, WINDOW_PAGES * CKPT_PAGE_SIZE, &err);
	if (err) {	/* not enough memory to compress: the image is whole all the same */
		ckpt_warn("cannot compress the image (%s): written uncompressed",
			  shim_strerror(err));
		err = 0;
	}
	if (!maps || !s.pagemap || !s.runs || !s.guards || (inc && !s.refs) ||
	    s.pagemap_fd < 0) {
		err = s.pagemap_fd < 0 ? errno : ENOMEM;
		goto out;
	}
	len = read_maps(maps, MAPS_MAX);	/* after our own mmaps: a stable list */
	if (len < 0) {
		err = -len;
		goto out;
	}
	for (char *line = maps, *nl; !err && *line; line = nl + 1) {
		struct region r;

		nl = strchr(line, '\n');
		if (!nl)
			break;
		*nl = '\0';
		err = parse_maps_line(line, &r);
		if (!err && !skip_region(&r))
			err = save_region(&s, &r);
	}
	if (!err)
		err = compress_flush(s.z, w);
out:
	compressor_free(s.z);
	if (s.pagemap_fd >= 0)
		close(s.pagemap_fd);
	if (s.runs)
		scratch_unmap(s.runs, runs_size);
	if (s.guards)
		scratch_unmap(s.guards, runs_size);
	if (s.refs)
		scratch_unmap(s.refs, refs_size);
	if (s.pagemap)
		scratch_unmap(s.pagemap, pm_size);
	if (maps)
		scratch_unmap(maps, MAPS_MAX);
	return err;
}

/* The windows of one shared-memory region, as save_region cuts them. */
static int snapshot_region(struct mem_saver *s, struct shm_snapshot *set, struct region *r)
{
	uint64_t step = WINDOW_PAGES * CKPT_PAGE_SIZE;
	int err = 0;

	r->kind = classify(r);
	/* an AIO ring is shared with the kernel: it changes as the job runs on */
	if (!shared_memory_kind(r->kind) && r->kind != CKPT_VMA_AIO_RING)
		return 0;
	for (uint64_t a = r->start, end; !err && a < r->end; a = end) {
		struct ckpt_vma v = { .start = a, .kind = r->kind,
				      .shm_id = shim_object_id(r->dev, r->inode) };

		end = a + step < r->end ? a + step : r->end;
		v.end = end;
		v.pgoff = r->pgoff + (a - r->start);
		err = shm_snapshot_add(set, a, end, saved_elsewhere(s, &v), r->prot & PROT_READ);
	}
	return err;
}

/*
 * Before a forked write, while the job is stopped: claim the shared memory
 * this process saves, as an in-place write would, and copy it.  NULL with
 * *err set when that is not possible (too much of it, say).
 */
struct shm_snapshot *snapshot_shared_memory(const char *shared_key, int *err)
{
	struct mem_saver s = { .shared_key = shared_key };
	char *maps = scratch_map(MAPS_MAX);
	struct shm_snapshot *set = shm_snapshot_new(WINDOW_PAGES * CKPT_PAGE_SIZE);
	ssize_t len = maps ? read_maps(maps, MAPS_MAX) : -ENOMEM;

	*err = !set ? ENOMEM : len < 0 ? (int)-len : 0;
	for (char *line = maps, *nl; !*err && *line; line = nl + 1) {
		struct region r;

		nl = strchr(line, '\n');
		if (!nl)
			break;
		*nl = '\0';
		*err = parse_maps_line(line, &r);
		if (!*err && !skip_region(&r))
			*err = snapshot_region(&s, set, &r);
	}
	if (maps)
		scratch_unmap(maps, MAPS_MAX);
	if (*err) {
		shm_snapshot_free(set);
		return NULL;
	}
	return set;
}
