/*
 * The epoll sets that watch an fd the plugin replaces at a release (a
 * completion channel's, the async fd).  A set's entry for a file goes when
 * the file goes, and the rebuild's dup3 puts a new file under the same
 * number: without this the application's event loop (Open MPI's progress
 * thread waits on its UD connection manager's channel so) would never hear
 * of the fd again.  The entries are read from the epoll fds' fdinfo
 * before the number is moved and added again for its new file: the async
 * fd's before the release and after the rebuild, a channel's each time
 * app_fds.c moves it (to a placeholder and back).  A restart is no
 * different (this memory is in the image; the epoll fds keep their
 * numbers).
 *
 * The application's threads may be parked holding malloc's lock: no
 * allocation here, only system calls and buffers on the stack.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "ckpt_proc.h"
#include "ib.h"

static int is_epoll(int fd)
{
	char link[64], target[32];
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, target, sizeof(target) - 1);
	if (n < 0)
		return 0;
	target[n] = '\0';
	return !strcmp(target, "anon_inode:[eventpoll]");
}

/* Entries of epoll fd epfd for the file of fd (number and inode). */
static void read_entries(int epfd, int fd, unsigned long ino, struct ib_epoll_watchers *w)
{
	char path[64], info[65536];	/* about 800 entries */
	ssize_t len;
	int in;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", epfd);
	in = open(path, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return;
	len = read(in, info, sizeof(info) - 1);
	close(in);
	if (len <= 0)
		return;
	info[len] = '\0';
	for (char *line = info, *next; line; line = next) {
		int tfd;
		unsigned events;
		unsigned long long data;
		unsigned long tino;

		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		if (sscanf(line, "tfd: %d events: %x data: %llx pos: %*u ino: %lx",
			   &tfd, &events, &data, &tino) != 4 || tfd != fd || tino != ino)
			continue;
		if (w->n == IB_EPOLL_WATCHERS_MAX) {
			ib_log("fd %d is watched by more than %d epoll sets: the others will not "
			       "hear of it again", fd, IB_EPOLL_WATCHERS_MAX);
			return;
		}
		w->e[w->n++] = (struct ib_epoll_watcher){ epfd, events, data };
	}
}

struct watched_fd {
	int fd;
	ino_t ino;
	struct ib_epoll_watchers *w;
};

static int epoll_set_entries(int dfd, const char *name, uint64_t ino, void *arg)
{
	struct watched_fd *wf = arg;
	int epfd = atoi(name);

	if (epfd != dfd && is_epoll(epfd))
		read_entries(epfd, wf->fd, wf->ino, wf->w);
	return 0;
}

void ib_epoll_watchers_save(int fd, struct ib_epoll_watchers *w)
{
	struct stat st;
	struct watched_fd wf = { fd, 0, w };

	w->n = 0;
	if (fd < 0 || fstat(fd, &st))
		return;
	wf.ino = st.st_ino;
	ckpt_dir_walk("/proc/self/fd", epoll_set_entries, &wf);
}

void ib_epoll_watchers_restore(int fd, const struct ib_epoll_watchers *w)
{
	if (w->n)
		ib_debug("fd %d: watched again by %u epoll set(s), the first %d", fd, w->n,
			 w->e[0].epfd);
	for (unsigned i = 0; i < w->n; i++) {
		struct epoll_event ev = { .events = w->e[i].events, .data.u64 = w->e[i].data };

		if (epoll_ctl(w->e[i].epfd, EPOLL_CTL_ADD, fd, &ev) &&
		    epoll_ctl(w->e[i].epfd, EPOLL_CTL_MOD, fd, &ev))
			ib_log("epoll fd %d cannot watch fd %d again: %m", w->e[i].epfd, fd);
	}
}
