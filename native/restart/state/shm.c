/*
 * Shared memory of the job (saved by native/shim/state/memory.c):
 * MAP_SHARED anonymous memory, memfds, /dev/shm files and System V
 * segments, each made once by pid 1 of the restart namespace and filled
 * from the image of the process that saved each range.
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
	int fd;				/* -1 for a System V segment */
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

void shms_create(struct image *imgs, unsigned n)
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
				memset(s, 0, sizeof(*s));
				s->id = v->shm_id;
				s->file = v->kind == CKPT_VMA_SHARED_MEMFILE ? &imgs[i].vmas[j] : NULL;
				s->name = imgs[i].vmas[j].path;
				if (v->kind == CKPT_VMA_SYSV_SHM)
					create_sysv(s, v);
			}
			if (v->pgoff + (v->end - v->start) > s->size)
				s->size = v->pgoff + (v->end - v->start);
		}
	for (unsigned i = 0; i < nshms; i++)
		if (!shms[i].sysv)
			shms[i].fd = move_high(open_shm_object(&shms[i]), "shared memory");
	/* fill each range once, from the process that saved it */
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nvmas; j++) {
			const struct loaded_vma *lv = &imgs[i].vmas[j];
			uint64_t lo = lv->v.pgoff, hi = lo + (lv->v.end - lv->v.start);

			if (!is_shared_memory(&lv->v) || (lv->v.flags & CKPT_VMA_PAGES_ELSEWHERE) ||
			    already_filled(done, ndone, lv->v.shm_id, lo, hi))
				continue;
			fill_from(&imgs[i], lv, find_shm(lv->v.shm_id));
			done[ndone++] = (struct filled){ lv->v.shm_id, lo, hi };
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
	for (unsigned i = 0; i < nshms; i++)
		if (shms[i].fd >= 0)
			sys1(SYS_close, shms[i].fd);
}
