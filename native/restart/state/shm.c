/*
 * Shared memory of the job (saved by native/shim/state/memory.c):
 * MAP_SHARED anonymous memory, memfds, /dev/shm files and System V
 * segments, each made once before the restart namespace's processes
 * exist and filled from the image of the process that saved each range.
 *
 * Shared anonymous memory has no name to open again: it is made as it
 * was, by mmap(MAP_SHARED | MAP_ANONYMOUS), at an address no image maps,
 * where every restored process inherits it.  Each maps its ranges from
 * there (mremap of a shared map with old size 0 maps the same pages
 * again), so /proc/<pid>/maps names them "/dev/zero (deleted)", one inode,
 * as the kernel named the original, and unmaps it once its memory is back.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <linux/filter.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <stdlib.h>
#include <termios.h>
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <linux/if_packet.h>
#include <linux/netlink.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include "ckpt_sockopts.h"
#include "restart.h"
#include "sys.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

struct shared_shm {
	uint64_t id;
	uint64_t size;
	const struct loaded_vma *file;	/* a /dev/shm file, or NULL: a memfd */
	const char *name;		/* a memfd's path, "/memfd:NAME (deleted)" */
	int fd;				/* -1 for a System V segment and anonymous memory */
	char *anon;			/* shared anonymous memory: where it waits */
	int filled_by_fd;		/* an fd's saved bytes are in it */
	int sysv;
	int sysv_id;
};

/* A range of a shm object already filled from some image. */
struct filled {
	uint64_t id, lo, hi;
};

static struct shared_shm *shms;
static unsigned nshms;

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

static void fill_from(struct image *img, const struct loaded_vma *lv, const struct shared_shm *s)
{
	const struct ckpt_vma *v = &lv->v;
	uint64_t len = v->end - v->start;
	char *p;

	if (s->anon) {
		read_region_at(img, lv, s->anon + v->pgoff);
		return;
	}
	if (s->sysv) {
		p = shmat(s->sysv_id, NULL, 0);
		if (p == (void *)-1)
			die("cannot fill System V segment %d: %s", s->sysv_id, strerror(errno));
		read_region_at(img, lv, p + v->pgoff);
		shmdt(p);
		return;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, v->pgoff);
	if (p == MAP_FAILED)
		die("cannot fill shared memory: %s", strerror(errno));
	read_region_at(img, lv, p);
	munmap(p, len);
}

/* A System V segment with its old id, in the restart's IPC namespace. */
static void create_sysv(struct shared_shm *s, const struct ckpt_vma *v)
{
	char id[16];
	int fd = open("/proc/sys/kernel/shm_next_id", O_WRONLY | O_CLOEXEC);
	int got;

	snprintf(id, sizeof(id), "%d", v->sysv_id);
	if (fd < 0 || write(fd, id, strlen(id)) != (ssize_t)strlen(id))
		die("cannot choose the System V segment id %d: %s", v->sysv_id, strerror(errno));
	close(fd);
	got = shmget(v->sysv_key ? v->sysv_key : IPC_PRIVATE, v->sysv_size,
		     IPC_CREAT | IPC_EXCL | (v->sysv_mode & 0777));
	if (got < 0)
		die("cannot recreate System V segment %d: %s", v->sysv_id, strerror(errno));
	if (got != v->sysv_id)
		die("System V segment %d came back as %d", v->sysv_id, got);
	s->sysv = 1;
	s->sysv_id = got;
	s->fd = -1;
}

/* MAP_SHARED | MAP_ANONYMOUS memory (or a shared map of /dev/zero): no
 * file of its own; named or not (PR_SET_VMA_ANON_NAME). */
static int is_shared_anonymous(const struct loaded_vma *lv)
{
	return lv->v.kind == CKPT_VMA_SHARED_ANON && lv->path &&
	       (!strcmp(lv->path, "/dev/zero (deleted)") || !strncmp(lv->path, "[anon_shmem:", 12));
}

/* The end of a region of the images that overlaps [lo, hi), or 0. */
static uint64_t image_region_within(const struct image *imgs, unsigned n, uint64_t lo, uint64_t hi)
{
	if (lo < CKPT_RESERVE_END && hi > CKPT_RESERVE_START)
		return CKPT_RESERVE_END;
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nvmas; j++) {
			const struct ckpt_vma *v = &imgs[i].vmas[j].v;

			if (v->start < hi && v->end > lo)
				return v->end;
		}
	return 0;
}

#define ANON_WAITS_FROM 0x100000000000UL	/* a hint: above the usual heaps */

/*
 * Shared anonymous memory of size bytes, where no region of the images
 * lies (nor the restart's own: the kernel places it), so that
 * restore_memory() keeps it until the process has mapped its regions.
 */
static char *anon_waiting_room(const struct image *imgs, unsigned n, uint64_t size)
{
	uint64_t hint = ANON_WAITS_FROM;

	for (int tries = 0; tries < 4096; tries++) {
		char *p = mmap((void *)hint, size, PROT_READ | PROT_WRITE,
			       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		uint64_t clash;

		if (p == MAP_FAILED)
			die("cannot recreate shared anonymous memory of %llu bytes: %s",
			    (unsigned long long)size, strerror(errno));
		clash = image_region_within(imgs, n, (uint64_t)p, (uint64_t)p + size);
		if (!clash)
			return p;
		munmap(p, size);
		hint = clash;
	}
	die("no room for shared anonymous memory of %llu bytes outside the images' regions",
	    (unsigned long long)size);
}

static int is_shared_memory(const struct ckpt_vma *v)
{
	return v->shm_id && (v->kind == CKPT_VMA_SHARED_ANON ||
			     v->kind == CKPT_VMA_SHARED_MEMFILE || v->kind == CKPT_VMA_SYSV_SHM);
}

/* A memfd (an unlinked file's again if it can be); or the /dev/shm file,
 * at its checkpointed size, whose pages are then written back. */
static int open_shm_object(const struct shared_shm *s)
{
	int fd;

	if (!s->file) {
		char name[MEMFD_NAME_MAX] = "ckpt-shared";	/* MAP_SHARED | MAP_ANONYMOUS */

		fd = unlinked_file_again(s->name);
		if (fd >= 0) {
			if (ftruncate(fd, s->size))
				die("cannot recreate unlinked file %s: %s", s->name, strerror(errno));
			return fd;
		}
		if (s->name && !strncmp(s->name, "/memfd:", 7))
			memfd_name_of(s->name, name);
		/* its seals are the shim's to add, once it is mapped */
		fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
		if (fd < 0 || ftruncate(fd, s->size))
			die("cannot recreate shared memory: %s", strerror(errno));
		return fd;
	}
	make_parent_dirs(s->file->path);	/* a scratch file's may be gone */
	fd = open(s->file->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0 || ftruncate(fd, s->file->v.file_size > s->size ? s->file->v.file_size : s->size))
		die("cannot restore shared file %s: %s", s->file->path, strerror(errno));
	return fd;
}

/* The object that a region (or an unlinked file's pages) names: made
 * once, the first time. */
static struct shared_shm *shm_of(const struct loaded_vma *lv)
{
	const struct ckpt_vma *v = &lv->v;
	struct shared_shm *s = find_shm(v->shm_id);

	if (s)
		return s;
	s = &shms[nshms++];
	memset(s, 0, sizeof(*s));
	s->id = v->shm_id;
	s->file = v->kind == CKPT_VMA_SHARED_MEMFILE ? lv : NULL;
	s->name = lv->path;
	s->fd = -1;
	if (v->kind == CKPT_VMA_SYSV_SHM)
		create_sysv(s, v);
	s->anon = is_shared_anonymous(lv) ? (char *)1 : NULL;	/* placed later */
	return s;
}

static void reaches(struct shared_shm *s, uint64_t end)
{
	if (end > s->size)
		s->size = end;
}

/*
 * An unlinked file (or memfd) that an fd of the job holds, whose bytes
 * came with the fd: all of them into the object made for its maps, which
 * the fd then opens (open_shm, fds.c), as long as it was.
 */
static void fill_from_fds(const struct image *img)
{
	for (unsigned j = 0; j < img->nfds; j++) {
		const struct loaded_fd *lf = &img->fds[j];
		struct shared_shm *s = find_shm(lf->f.object_id);

		if (lf->f.kind != CKPT_FD_DELETED_FILE || !lf->f.contents_saved || !s ||
		    s->fd < 0 || s->filled_by_fd)
			continue;
		if (lseek(s->fd, 0, SEEK_SET) < 0 || ftruncate(s->fd, lf->f.data_size))
			die("cannot recreate unlinked file %s: %s", lf->path, strerror(errno));
		write_all(s->fd, lf->data, lf->f.data_size, lf->path);
		s->filled_by_fd = 1;
	}
}

/* Fill the object behind lv's range from lv's image, unless done. */
static void fill_once(struct image *img, const struct loaded_vma *lv, struct filled *done,
		      unsigned *ndone)
{
	uint64_t lo = lv->v.pgoff, hi = lo + (lv->v.end - lv->v.start);

	if ((lv->v.flags & CKPT_VMA_PAGES_ELSEWHERE) ||
	    already_filled(done, *ndone, lv->v.shm_id, lo, hi))
		return;
	fill_from(img, lv, find_shm(lv->v.shm_id));
	done[(*ndone)++] = (struct filled){ lv->v.shm_id, lo, hi };
}

void shms_create(struct image *imgs, unsigned n)
{
	unsigned total = 0, ndone = 0;
	struct filled *done;

	for (unsigned i = 0; i < n; i++)
		total += imgs[i].nvmas + imgs[i].nfile_pages;
	shms = arena_alloc(sizeof(*shms) * (total + 1));
	done = arena_alloc(sizeof(*done) * (total + 1));
	for (unsigned i = 0; i < n; i++) {
		for (unsigned j = 0; j < imgs[i].nvmas; j++) {
			const struct loaded_vma *lv = &imgs[i].vmas[j];

			if (is_shared_memory(&lv->v))
				reaches(shm_of(lv), lv->v.pgoff + (lv->v.end - lv->v.start));
		}
		/* an unlinked file that only private maps show: to its end */
		for (unsigned j = 0; j < imgs[i].nfile_pages; j++)
			reaches(shm_of(&imgs[i].file_pages[j]), imgs[i].file_pages[j].v.file_size);
	}
	for (unsigned i = 0; i < nshms; i++)
		if (shms[i].anon)
			shms[i].anon = anon_waiting_room(imgs, n, shms[i].size);
		else if (!shms[i].sysv)
			shms[i].fd = move_high(open_shm_object(&shms[i]), "shared memory");
	for (unsigned i = 0; i < n; i++)
		fill_from_fds(&imgs[i]);
	/* fill each range once, from the process that saved it */
	for (unsigned i = 0; i < n; i++) {
		for (unsigned j = 0; j < imgs[i].nvmas; j++)
			if (is_shared_memory(&imgs[i].vmas[j].v))
				fill_once(&imgs[i], &imgs[i].vmas[j], done, &ndone);
		for (unsigned j = 0; j < imgs[i].nfile_pages; j++)
			fill_once(&imgs[i], &imgs[i].file_pages[j], done, &ndone);
	}
}

/* The System V id of a segment of the job, or -1. */
int shared_sysv_id(uint64_t id)
{
	const struct shared_shm *s = id ? find_shm(id) : NULL;

	return s && s->sysv ? s->sysv_id : -1;
}

int shared_shm_fd(uint64_t id)
{
	const struct shared_shm *s = id ? find_shm(id) : NULL;

	return s ? s->fd : -1;
}

/* Whether the file at path is a shared memory file of the job that the
 * restart wrote back (a /dev/shm or scratch file mapped shared): its
 * contents are the checkpoint's, its mtime now. */
int shared_file_rewritten(const char *path)
{
	for (unsigned i = 0; i < nshms; i++)
		if (shms[i].file && !strcmp(shms[i].file->path, path))
			return 1;
	return 0;
}

/* Where shared anonymous memory of the job waits to be mapped, or NULL. */
char *shared_anon_at(uint64_t id)
{
	const struct shared_shm *s = id ? find_shm(id) : NULL;

	return s ? s->anon : NULL;
}

/* Whether [start, end) holds shared anonymous memory waiting to be mapped:
 * restore_memory() leaves it in place. */
int shared_anon_waits_in(uint64_t start, uint64_t end)
{
	for (unsigned i = 0; i < nshms; i++)
		if (shms[i].anon && (uint64_t)shms[i].anon < end &&
		    (uint64_t)shms[i].anon + shms[i].size > start)
			return 1;
	return 0;
}

unsigned shm_fds(int *out, unsigned max)
{
	unsigned k = 0;

	for (unsigned i = 0; i < nshms && k < max; i++)
		if (shms[i].fd >= 0)
			out[k++] = shms[i].fd;
	return k;
}

/* After the memory is back: raw system calls only. */
void shms_close(void)
{
	for (unsigned i = 0; i < nshms; i++) {
		if (shms[i].fd >= 0)
			sys1(SYS_close, shms[i].fd);
		if (shms[i].anon)
			sys2(SYS_munmap, shms[i].anon, shms[i].size);
	}
}
