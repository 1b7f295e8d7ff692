/*
 * Rebuilding the fd table of the image, before the point of no return (so
 * glibc is still usable).  New files are opened at whatever number the
 * kernel gives, moved above every number of the image, and only then
 * dup2()ed into place: no restored fd can clobber another.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "restart.h"

static int stdio_fds[3] = { -1, -1, -1 };	/* the restarter's own stdio */
static int image_fd = -1;
static int fd_base = 3;			/* above every fd number of the image */

int restart_fd_base(void)
{
	return fd_base;
}

/* Every fd ckpt-restart holds lives at or above fd_base, out of the way of
 * the numbers it restores; the fd limit must leave room for them. */
static void choose_fd_base(struct image *imgs, unsigned n)
{
	struct rlimit rl;
	unsigned long need = 16;
	int highest = 2;

	for (unsigned i = 0; i < n; i++) {
		for (unsigned j = 0; j < imgs[i].nfds; j++)
			if (imgs[i].fds[j].f.fd > highest)
				highest = imgs[i].fds[j].f.fd;
		need += 3 * imgs[i].nfds + imgs[i].nvmas + 1;
	}
	fd_base = highest + 1;
	if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur < (rlim_t)fd_base + need)
		die("the images use fd %d: RLIMIT_NOFILE (%llu) is too low to restore them",
		    highest, (unsigned long long)rl.rlim_cur);
}

int move_high(int fd, const char *what)
{
	int high;

	if (fd < 0)
		die("cannot restore fd for %s: %s", what, strerror(errno));
	if (fd >= fd_base)
		return fd;
	high = fcntl(fd, F_DUPFD_CLOEXEC, fd_base);
	if (high < 0)
		die("cannot restore fd for %s: %s", what, strerror(errno));
	close(fd);
	return high;
}

static void keep_stdio(void)
{
	for (int i = 0; i < 3; i++)
		stdio_fds[i] = fcntl(i, F_DUPFD_CLOEXEC, fd_base);
	set_error_fd(stdio_fds[2] >= 0 ? stdio_fds[2] : 2);
}

/* Everything inherited from whoever ran us goes, other images' fds too,
 * but what this process restores from. */
static void close_others(void)
{
	unsigned max = 5 + MAX_FDS * 3, nkeep = 0, lo = 0;
	int *keep = arena_alloc(sizeof(int) * max);

	keep[nkeep++] = image_fd;
	keep[nkeep++] = tree_report_fd();
	for (int i = 0; i < 3; i++)
		keep[nkeep++] = stdio_fds[i];
	nkeep += shared_fds(keep + nkeep, max - nkeep);
	for (unsigned i = 1; i < nkeep; i++)	/* sort, then close the gaps */
		for (unsigned j = i; j > 0 && keep[j - 1] > keep[j]; j--) {
			int t = keep[j];

			keep[j] = keep[j - 1];
			keep[j - 1] = t;
		}
	for (unsigned i = 0; i < nkeep; i++) {
		if (keep[i] < 0 || (unsigned)keep[i] < lo)
			continue;
		if ((unsigned)keep[i] > lo)
			syscall(SYS_close_range, lo, keep[i] - 1, 0);
		lo = keep[i] + 1;
	}
	syscall(SYS_close_range, lo, ~0U, 0);
}

void write_all(int fd, const char *p, size_t len, const char *what)
{
	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("cannot refill %s: %s", what, strerror(errno));
		p += n;
		len -= n;
	}
}

/* An unlinked file: recreate it with its contents, open it, unlink it. */
static int open_deleted(const struct loaded_fd *lf)
{
	char tmp[CKPT_PATH_MAX + 32], dir[CKPT_PATH_MAX];
	int flags = lf->f.flags & ~(O_CREAT | O_EXCL | O_TRUNC);
	int fd, wfd;

	snprintf(dir, sizeof(dir), "%s", lf->path);
	snprintf(tmp, sizeof(tmp), "%s", lf->path);
	wfd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, lf->f.mode & 07777);
	if (wfd < 0) {			/* the name is taken again: use another */
		snprintf(tmp, sizeof(tmp), "%s/.ckpt-restored-%d-%d", dirname(dir),
			 getpid(), lf->f.fd);
		wfd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, lf->f.mode & 07777);
	}
	if (wfd < 0)
		die("cannot recreate deleted file %s: %s", lf->path, strerror(errno));
	write_all(wfd, lf->data, lf->f.data_size, lf->path);
	fd = open(tmp, flags | O_CLOEXEC);
	unlink(tmp);
	close(wfd);
	return fd;
}

static int open_path(const struct loaded_fd *lf)
{
	int flags = lf->f.flags & ~(O_CREAT | O_EXCL | O_TRUNC);
	int fd = open(lf->path, flags | O_CLOEXEC);

	if (fd < 0)
		die("cannot reopen fd %d (%s): %s", lf->f.fd, lf->path, strerror(errno));
	return fd;
}

static int restarter_stdio(int which)
{
	int src = stdio_fds[which >= 0 && which <= 2 ? which : 2];

	if (src < 0)
		return open("/dev/null", O_RDWR | O_CLOEXEC);
	return fcntl(src, F_DUPFD_CLOEXEC, 0);
}

/* A memfd (or other shared memory object) held as an fd: a new open file
 * on the object that the restart shares with every mapping of it. */
static int open_shm(const struct loaded_fd *lf, int shm)
{
	char path[64];
	int fd;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", shm);
	fd = open(path, (lf->f.flags & ~(O_CREAT | O_EXCL | O_TRUNC)) | O_CLOEXEC);
	if (fd < 0 || lseek(fd, lf->f.offset, SEEK_SET) < 0)
		die("cannot reopen shared memory %s: %s", lf->path, strerror(errno));
	return fd;
}

/* An end of a pipe of the job, or, for a pipe to outside the job, what
 * the restarter has (stdio) or /dev/null. */
static int open_pipe_end(const struct loaded_fd *lf)
{
	int end = shared_pipe_end(lf->f.object_id, lf->f.kind == CKPT_FD_PIPE_WRITE);

	if (end >= 0)
		return fcntl(end, F_DUPFD_CLOEXEC, 0);
	if (lf->f.stdio_fd >= 0)
		return restarter_stdio(lf->f.stdio_fd);
	return open("/dev/null", O_RDWR | O_CLOEXEC);
}

static int open_one(const struct loaded_fd *lf)
{
	switch (lf->f.kind) {
	case CKPT_FD_FILE:
	case CKPT_FD_DEVICE:
	case CKPT_FD_DIRECTORY: {
		int fd = open_path(lf);

		if (lf->f.kind != CKPT_FD_DEVICE && lseek(fd, lf->f.offset, SEEK_SET) < 0)
			die("cannot seek fd %d (%s): %s", lf->f.fd, lf->path, strerror(errno));
		return fd;
	}
	case CKPT_FD_DELETED_FILE: {
		int shm = shared_shm_fd(lf->f.object_id);
		int fd = shm >= 0 ? open_shm(lf, shm) : open_deleted(lf);

		if (fd < 0 || lseek(fd, lf->f.offset, SEEK_SET) < 0)
			die("cannot restore deleted file %s: %s", lf->path, strerror(errno));
		return fd;
	}
	case CKPT_FD_TTY:
	case CKPT_FD_INHERIT:
		return restarter_stdio(lf->f.kind == CKPT_FD_TTY ? lf->f.fd : lf->f.stdio_fd);
	case CKPT_FD_PIPE_READ:
	case CKPT_FD_PIPE_WRITE:
		return open_pipe_end(lf);
	default:
		return open("/dev/null", O_RDWR | O_CLOEXEC);
	}
}

/* Another fd on the open file of a lower fd (fds 1 and 2 of `>log 2>&1`). */
static int dup_placed(struct image *img, const int *placed, unsigned idx)
{
	for (unsigned j = 0; j < idx; j++)
		if (img->fds[j].f.fd == img->fds[idx].f.dup_of)
			return fcntl(placed[j], F_DUPFD_CLOEXEC, fd_base);
	die("%s: fd %d is a dup of fd %d, which is not in the image", img->file,
	    img->fds[idx].f.fd, img->fds[idx].f.dup_of);
}

/* In ckpt-restart itself, before anything is created: every fd it holds
 * from now on lives above every fd number of every image. */
void prepare_fds(struct image *imgs, unsigned n)
{
	choose_fd_base(imgs, n);
	for (unsigned i = 0; i < n; i++)
		imgs[i].fd = move_high(imgs[i].fd, "an image");
	keep_stdio();
}

void restore_fds(struct image *img)
{
	int *placed = arena_alloc(sizeof(int) * (img->nfds + 1));

	image_fd = img->fd;
	close_others();
	for (unsigned i = 0; i < img->nfds; i++)
		placed[i] = move_high(img->fds[i].f.dup_of >= 0 ? dup_placed(img, placed, i) :
				      open_one(&img->fds[i]), img->fds[i].path);
	for (unsigned i = 0; i < img->nfds; i++) {
		const struct ckpt_fd *f = &img->fds[i].f;

		if (dup3(placed[i], f->fd, (f->fd_flags & FD_CLOEXEC) ? O_CLOEXEC : 0) < 0)
			die("cannot place fd %d: %s", f->fd, strerror(errno));
		if (f->kind == CKPT_FD_PIPE_READ || f->kind == CKPT_FD_PIPE_WRITE)
			fcntl(f->fd, F_SETFL, f->flags);
		close(placed[i]);
	}
	shared_close_pipes();
}

/* Just before jumping into the image: the restarter's own fds go away. */
void close_restart_fds(void)
{
	for (int i = 0; i < 3; i++)
		if (stdio_fds[i] >= 0)
			syscall(SYS_close, stdio_fds[i]);
	syscall(SYS_close, image_fd);
	syscall(SYS_close, tree_report_fd());
}
