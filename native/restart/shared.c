/*
 * What the processes of one restart share: pipes and shared memory
 * objects (MAP_SHARED anonymous memory, memfds, unlinked /dev/shm files).
 * pid 1 of the restart namespace creates each one once, filled with its
 * saved contents, before any restored process exists: every process
 * inherits them, above every fd number of the images, and takes the ones
 * its image names.  A pipe with an end outside the job is not recreated.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "restart.h"
#include "sys.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

struct shared_pipe {
	uint64_t id;
	int end[2];			/* read, write */
};

struct shared_shm {
	uint64_t id;
	uint64_t size;
	const struct loaded_vma *file;	/* a /dev/shm file, or NULL: a memfd */
	int fd;
};

/* A range of a shm object already filled from some image. */
struct filled {
	uint64_t id, lo, hi;
};

static struct shared_pipe *pipes;
static unsigned npipes;
static struct shared_shm *shms;
static unsigned nshms;

static int is_pipe(const struct loaded_fd *lf)
{
	return lf->f.dup_of < 0 &&
	       (lf->f.kind == CKPT_FD_PIPE_READ || lf->f.kind == CKPT_FD_PIPE_WRITE);
}

static int job_has_end(struct image *imgs, unsigned n, uint64_t id, uint32_t kind)
{
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++)
			if (imgs[i].fds[j].f.kind == kind && imgs[i].fds[j].f.object_id == id)
				return 1;
	return 0;
}

static struct shared_pipe *find_pipe(uint64_t id)
{
	for (unsigned i = 0; i < npipes; i++)
		if (pipes[i].id == id)
			return &pipes[i];
	return NULL;
}

/* The pipe's bytes, from the first reader that saved them. */
static void refill_pipe(struct image *imgs, unsigned n, const struct shared_pipe *sp)
{
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++) {
			const struct loaded_fd *lf = &imgs[i].fds[j];

			if (lf->f.kind == CKPT_FD_PIPE_READ && lf->f.object_id == sp->id &&
			    lf->f.data_size) {
				write_all(sp->end[1], lf->data, lf->f.data_size, "a pipe");
				return;
			}
		}
}

static void create_pipes(struct image *imgs, unsigned n)
{
	unsigned total = 0;

	for (unsigned i = 0; i < n; i++)
		total += imgs[i].nfds;
	pipes = arena_alloc(sizeof(*pipes) * (total + 1));
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++) {
			const struct loaded_fd *lf = &imgs[i].fds[j];
			struct shared_pipe *sp;
			int p[2];

			if (!is_pipe(lf) || find_pipe(lf->f.object_id) ||
			    !job_has_end(imgs, n, lf->f.object_id, CKPT_FD_PIPE_READ) ||
			    !job_has_end(imgs, n, lf->f.object_id, CKPT_FD_PIPE_WRITE))
				continue;
			if (pipe2(p, O_CLOEXEC))
				die("cannot recreate a pipe: %s", strerror(errno));
			sp = &pipes[npipes++];
			sp->id = lf->f.object_id;
			sp->end[0] = move_high(p[0], "a pipe");
			sp->end[1] = move_high(p[1], "a pipe");
			if (lf->f.offset > 0)	/* the saved capacity */
				fcntl(sp->end[1], F_SETPIPE_SZ, (int)lf->f.offset);
			refill_pipe(imgs, n, sp);
		}
}

static struct shared_shm *find_shm(uint64_t id)
{
	for (unsigned i = 0; i < nshms; i++)
		if (shms[i].id == id)
			return &shms[i];
	return NULL;
}

static int already_filled(const struct filled *done, unsigned ndone, uint64_t id,
			  uint64_t lo, uint64_t hi)
{
	for (unsigned i = 0; i < ndone; i++)
		if (done[i].id == id && done[i].lo <= lo && done[i].hi >= hi)
			return 1;
	return 0;
}

/* One region's saved pages, read straight into the object. */
static void fill_from(struct image *img, const struct loaded_vma *lv, int fd)
{
	const struct ckpt_vma *v = &lv->v;
	uint64_t len = v->end - v->start;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, v->pgoff);
	uint64_t off = v->data_offset;

	if (p == MAP_FAILED)
		die("cannot fill shared memory: %s", strerror(errno));
	for (uint64_t r = 0; r < v->nruns; r++) {
		uint64_t bytes = lv->runs[r].npages * CKPT_PAGE_SIZE;

		madvise(p + lv->runs[r].offset, bytes, MADV_POPULATE_WRITE);
		read_exact_at(img, p + lv->runs[r].offset, bytes, off);
		off += bytes;
	}
	munmap(p, len);
}

static int is_shared_memory(const struct ckpt_vma *v)
{
	return v->shm_id &&
	       (v->kind == CKPT_VMA_SHARED_ANON || v->kind == CKPT_VMA_SHARED_MEMFILE);
}

/* A memfd; or the /dev/shm file, at its checkpointed size, whose pages
 * are then written back. */
static int open_shm_object(const struct shared_shm *s)
{
	int fd;

	if (!s->file) {
		fd = memfd_create("ckpt-shared", MFD_CLOEXEC);
		if (fd < 0 || ftruncate(fd, s->size))
			die("cannot recreate shared memory: %s", strerror(errno));
		return fd;
	}
	fd = open(s->file->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0 || ftruncate(fd, s->file->v.file_size > s->size ? s->file->v.file_size : s->size))
		die("cannot restore shared file %s: %s", s->file->path, strerror(errno));
	return fd;
}

static void create_shms(struct image *imgs, unsigned n)
{
	unsigned total = 0, ndone = 0;
	struct filled *done;

	for (unsigned i = 0; i < n; i++)
		total += imgs[i].nvmas;
	shms = arena_alloc(sizeof(*shms) * (total + 1));
	done = arena_alloc(sizeof(*done) * (total + 1));
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nvmas; j++) {
			const struct ckpt_vma *v = &imgs[i].vmas[j].v;
			struct shared_shm *s;

			if (!is_shared_memory(v))
				continue;
			s = find_shm(v->shm_id);
			if (!s) {
				s = &shms[nshms++];
				s->id = v->shm_id;
				s->size = 0;
				s->file = v->kind == CKPT_VMA_SHARED_MEMFILE ? &imgs[i].vmas[j] : NULL;
			}
			if (v->pgoff + (v->end - v->start) > s->size)
				s->size = v->pgoff + (v->end - v->start);
		}
	for (unsigned i = 0; i < nshms; i++)
		shms[i].fd = move_high(open_shm_object(&shms[i]), "shared memory");
	/* every process saved what it mapped: fill each range once */
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nvmas; j++) {
			const struct loaded_vma *lv = &imgs[i].vmas[j];
			uint64_t lo = lv->v.pgoff, hi = lo + (lv->v.end - lv->v.start);

			if (!is_shared_memory(&lv->v) ||
			    already_filled(done, ndone, lv->v.shm_id, lo, hi))
				continue;
			fill_from(&imgs[i], lv, find_shm(lv->v.shm_id)->fd);
			done[ndone++] = (struct filled){ lv->v.shm_id, lo, hi };
		}
}

void shared_create(struct image *imgs, unsigned n)
{
	create_pipes(imgs, n);
	create_shms(imgs, n);
}

int shared_pipe_end(uint64_t id, int write_end)
{
	const struct shared_pipe *sp = find_pipe(id);

	return sp ? sp->end[write_end] : -1;
}

int shared_shm_fd(uint64_t id)
{
	const struct shared_shm *s = id ? find_shm(id) : NULL;

	return s ? s->fd : -1;
}

/* The fds a restored process keeps while it restores. */
unsigned shared_fds(int *out, unsigned max)
{
	unsigned k = 0;

	for (unsigned i = 0; i < npipes && k + 2 <= max; i++) {
		out[k++] = pipes[i].end[0];
		out[k++] = pipes[i].end[1];
	}
	for (unsigned i = 0; i < nshms && k < max; i++)
		out[k++] = shms[i].fd;
	return k;
}

void shared_close_pipes(void)
{
	for (unsigned i = 0; i < npipes; i++) {
		close(pipes[i].end[0]);
		close(pipes[i].end[1]);
	}
}

/* After the memory is back: raw system calls only. */
void shared_close_shms(void)
{
	for (unsigned i = 0; i < nshms; i++)
		sys1(SYS_close, shms[i].fd);
}
