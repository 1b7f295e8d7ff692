/*
 * inotify watches.  The kernel shows a watch as its number, the watched
 * inode and a mask (fdinfo), never a path, so the paths are remembered
 * here as the program adds watches; the checkpoint keeps the watches
 * fdinfo shows (a watch the kernel dropped, IN_IGNORED, is gone there),
 * and restart/fds.c adds them again with their numbers.  Events queued at
 * the checkpoint were taken out of the instance (inotify_queue.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "shim.h"

#define MAX_WATCHES 4096

struct watch {
	int wd;
	dev_t dev;		/* the watched inode, as fdinfo names it */
	ino_t ino;
	char *path;		/* absolute, as the program gave it */
};

static struct watch watches[MAX_WATCHES];
static unsigned nwatches;
static char watches_lock;	/* app threads only; the checkpoint thread reads
				 * while they are parked */

static void lock(void)
{
	while (__atomic_test_and_set(&watches_lock, __ATOMIC_ACQUIRE))
		;
}

static void unlock(void)
{
	__atomic_clear(&watches_lock, __ATOMIC_RELEASE);
}

static char *absolute(const char *path)
{
	char cwd[PATH_MAX], *out;

	if (path[0] == '/')
		return strdup(path);
	if (!getcwd(cwd, sizeof(cwd)) || asprintf(&out, "%s/%s", cwd, path) < 0)
		return NULL;
	return out;
}

/* The same watch again (IN_MASK_ADD, or the same inode) keeps its entry. */
static void remember(int wd, const char *path, uint32_t mask)
{
	struct stat st;
	char *abs;

	if (((mask & IN_DONT_FOLLOW) ? lstat(path, &st) : stat(path, &st)) ||
	    !(abs = absolute(path)))
		return;
	lock();
	for (unsigned i = 0; i < nwatches; i++)
		if (watches[i].wd == wd && watches[i].dev == st.st_dev && watches[i].ino == st.st_ino) {
			unlock();
			free(abs);
			return;
		}
	if (nwatches < MAX_WATCHES)
		watches[nwatches++] = (struct watch){ wd, st.st_dev, st.st_ino, abs };
	else
		free(abs);
	unlock();
}

SHIM_EXPORT int inotify_add_watch(int fd, const char *path, uint32_t mask)
{
	long wd = syscall(SYS_inotify_add_watch, fd, path, mask);

	if (wd >= 0 && !checkpointer_is_current()) {
		int saved = errno;

		remember((int)wd, path, mask);
		errno = saved;
	}
	return (int)wd;
}

/* The path of the watch fdinfo shows, or NULL. */
static const char *watch_path(int wd, unsigned long long ino, unsigned sdev)
{
	/* fdinfo's sdev is the kernel's encoding: major << 20 | minor */
	dev_t dev = makedev(sdev >> 20, sdev & 0xfffff);

	for (unsigned i = 0; i < nwatches; i++)
		if (watches[i].wd == wd && watches[i].ino == ino && watches[i].dev == dev)
			return watches[i].path;
	return NULL;
}

static int add_watch(struct fd_payload *q, int wd, uint32_t mask, const char *path)
{
	struct ckpt_inotify_watch w = { .wd = wd, .mask = mask, .path_len = strlen(path) };
	size_t need = q->len + sizeof(w) + w.path_len;

	if (need > q->cap) {
		size_t cap = need * 2 + 4096;
		char *bigger = scratch_map(cap);

		if (!bigger)
			return ENOMEM;
		if (q->data) {
			memcpy(bigger, q->data, q->len);
			scratch_unmap(q->data, q->cap);
		}
		q->data = bigger;
		q->cap = cap;
	}
	memcpy(q->data + q->len, &w, sizeof(w));
	memcpy(q->data + q->len + sizeof(w), path, w.path_len);
	q->len = need;
	return 0;
}

/* One "inotify wd:N ino:I sdev:D mask:M ..." line per watch. */
int inotify_describe(int fd, const char *info, struct ckpt_fd *rec, struct fd_payload *q)
{
	int err = 0;

	rec->kind = CKPT_FD_INOTIFY;
	for (const char *p = info; !err && (p = strstr(p, "inotify wd:")); p += 11) {
		unsigned long long ino;
		unsigned wd, sdev, mask;
		const char *path;

		if (sscanf(p, "inotify wd:%x ino:%llx sdev:%x mask:%x", &wd, &ino, &sdev, &mask) != 4)
			continue;
		path = watch_path((int)wd, ino, sdev);
		if (path)
			err = add_watch(q, (int)wd, mask, path);
		else
			ckpt_warn("fd %d: inotify watch %u (inode %llu) was not added through the "
				  "shim: it will not be there after restart", fd, wd, ino);
	}
	return err;
}
