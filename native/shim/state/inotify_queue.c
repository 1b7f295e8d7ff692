/*
 * inotify events queued and not read yet at a checkpoint.  The kernel
 * lets them be read, never put back, so the checkpoint takes them out of
 * each instance (while the job is stopped) into memory of the process's
 * own, which the image saves like any other, and read() hands them to the
 * program, oldest first, before anything the kernel queues later.  That
 * holds after a plain checkpoint and after a restart alike.
 *
 * A program that polls before it reads must still find the fd readable:
 * a watch of our own on a memfd of our own (IN_ONESHOT) is made to fire,
 * which queues a real event, and that event and its IN_IGNORED are cut
 * out of what read() returns.  It takes one watch number, as a watch the
 * program made and removed would (the next one the program gets is one
 * higher).  Programs that read an inotify fd through readv() or a raw
 * system call do not see the events taken.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "shim.h"

#define MAX_QUEUES 64
#define MAX_FDS 4096

struct taken_events {
	int used;
	int fd;			/* the program's fd */
	char *buf;		/* mmap'ed: saved with the process's memory */
	size_t cap, off, len;	/* events [off, len) still to be read */
	int own_wd;		/* the watch that made the fd readable, or 0 */
	int own_events;		/* its events not cut out yet (2: the event, IN_IGNORED) */
};

static struct taken_events queues[MAX_QUEUES];
static int queues_used;		/* read()'s fast path: 0 */
static char queues_lock;	/* app threads; the checkpoint thread takes
				 * events while they are parked */

extern ssize_t __read(int fd, void *buf, size_t count);
extern void __chk_fail(void) __attribute__((noreturn));

/* Every signal blocked while the lock is held: a thread parked for a
 * checkpoint (or forked from) holding it would stop everyone else. */
static void lock(sigset_t *saved)
{
	sigset_t all;

	sigfillset(&all);
	syscall(SYS_rt_sigprocmask, SIG_BLOCK, &all, saved, sizeof(long));
	while (__atomic_test_and_set(&queues_lock, __ATOMIC_ACQUIRE))
		;
}

static void unlock(const sigset_t *saved)
{
	__atomic_clear(&queues_lock, __ATOMIC_RELEASE);
	syscall(SYS_rt_sigprocmask, SIG_SETMASK, saved, NULL, sizeof(long));
}

static struct taken_events *queue_of(int fd)
{
	for (int i = 0; i < MAX_QUEUES; i++)
		if (queues[i].used && queues[i].fd == fd)
			return &queues[i];
	return NULL;
}

/* Nothing left to hand out or cut out: the slot is free again. */
static void release_if_done(struct taken_events *q)
{
	if (q->used && q->len == q->off && !q->own_events) {
		q->used = 0;
		__atomic_sub_fetch(&queues_used, 1, __ATOMIC_RELEASE);
	}
}

static int make_room(struct taken_events *q, size_t more)
{
	size_t need = q->len + more, cap;
	void *p;

	if (need <= q->cap)
		return 0;
	cap = (need + 65535) & ~(size_t)65535;
	p = q->buf ? mremap(q->buf, q->cap, cap, MREMAP_MAYMOVE) :
		     mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return errno;
	q->buf = p;
	q->cap = cap;
	return 0;
}

/*
 * A real event on the instance (ours: our fd of it), so that poll() says
 * readable while taken events wait: a one-shot watch on a fresh memfd,
 * fired by a chmod.
 */
static void make_readable(struct taken_events *q, int ours)
{
	int memfd = syscall(SYS_memfd_create, "ckpt-inotify", MFD_CLOEXEC);
	char path[64];
	long wd;

	q->own_wd = 0;
	q->own_events = 0;
	if (memfd < 0)
		return;
	/* thread-self: the checkpoint thread's fd table is not the process's */
	snprintf(path, sizeof(path), "/proc/thread-self/fd/%d", memfd);
	wd = syscall(SYS_inotify_add_watch, ours, path, IN_ATTRIB | IN_ONESHOT);
	if (wd > 0) {
		q->own_wd = (int)wd;
		q->own_events = 2;
		fchmod(memfd, 0600);
	}
	close(memfd);
}

static struct taken_events *slot_for(int fd)
{
	struct taken_events *q = queue_of(fd);

	for (int i = 0; !q && i < MAX_QUEUES; i++)
		if (!queues[i].used) {
			q = &queues[i];
			q->used = 1;
			q->fd = fd;
			q->off = q->len = 0;
			q->own_events = 0;
			__atomic_add_fetch(&queues_used, 1, __ATOMIC_RELEASE);
		}
	return q;
}

/* Our own watch's events cut out of what the kernel gave. */
static size_t cut_own(struct taken_events *q, char *buf, size_t len)
{
	size_t at = 0;

	while (q->own_events && at + sizeof(struct inotify_event) <= len) {
		struct inotify_event *e = (void *)(buf + at);
		size_t size = sizeof(*e) + e->len;

		if (e->wd != q->own_wd) {
			at += size;
			continue;
		}
		memmove(buf + at, buf + at + size, len - at - size);
		len -= size;
		q->own_events--;
	}
	return len;
}

/* Move what the kernel queued on the program's inotify fd into q (our own
 * events of an earlier checkpoint, not read yet, left out). */
static int take_events(struct taken_events *q, int ours)
{
	int queued = 0;
	ssize_t n;
	int err;

	if (ioctl(ours, FIONREAD, &queued) || queued <= 0)
		return 0;
	if (q->off == q->len)
		q->off = q->len = 0;
	err = make_room(q, queued);
	if (err)
		return err;
	n = syscall(SYS_read, ours, q->buf + q->len, (size_t)queued);
	if (n < 0)
		return errno == EAGAIN ? 0 : errno;
	q->len += cut_own(q, q->buf + q->len, (size_t)n);
	return 0;
}

/* Whether the program's fd is an inotify fd (now). */
static int is_inotify(int fd)
{
	char path[64], link[64];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, link, sizeof(link) - 1);
	return n > 0 && (link[n] = '\0', !strcmp(link, "anon_inode:inotify"));
}

/* At SUSPEND, every thread parked: the events of every inotify fd. */
int inotify_take_queued(char *why, size_t why_size)
{
	int fds[MAX_FDS], nfds = app_list_fds(fds, MAX_FDS), err = 0;

	for (int i = 0; !err && i < nfds; i++) {
		struct taken_events *q;
		int ours;

		if (!is_inotify(fds[i]))
			continue;
		ours = app_getfd(fds[i]);
		if (ours < 0)
			continue;
		q = slot_for(fds[i]);
		if (!q) {
			snprintf(why, why_size, "fd %d: more than %d inotify fds with events queued",
				 fds[i], MAX_QUEUES);
			err = ENOTSUP;
		} else {
			err = take_events(q, ours);
			if (err)
				snprintf(why, why_size, "fd %d: taking its queued inotify events: %s",
					 fds[i], shim_strerror(err));
			else if (q->len > q->off && !q->own_events)
				make_readable(q, ours);
		}
		close(ours);
		if (q)
			release_if_done(q);
	}
	return err;
}

/* After a restart: the instance is new, our own events are not in it. */
void inotify_taken_restarted(void)
{
	for (int i = 0; i < MAX_QUEUES; i++) {
		struct taken_events *q = &queues[i];
		int ours;

		if (!q->used)
			continue;
		q->own_events = 0;
		release_if_done(q);
		if (!q->used)
			continue;
		ours = app_getfd(q->fd);
		if (ours >= 0) {
			make_readable(q, ours);
			close(ours);
		}
	}
}

/* Whole events from the taken ones, as many as fit (none: EINVAL, as the
 * kernel says when the next event does not fit). */
static ssize_t read_taken(struct taken_events *q, char *buf, size_t count)
{
	size_t n = 0;

	while (q->off + n < q->len) {
		const struct inotify_event *e = (const void *)(q->buf + q->off + n);
		size_t size = sizeof(*e) + e->len;

		if (n + size > count)
			break;
		n += size;
	}
	if (!n) {
		errno = EINVAL;
		return -1;
	}
	memcpy(buf, q->buf + q->off, n);
	q->off += n;
	return (ssize_t)n;
}

/* Taken events of fd, as many whole ones as fit; 0 in *served when
 * none are left (nor the fd is an inotify fd any more). */
static ssize_t read_taken_of(int fd, char *buf, size_t count, int *served)
{
	struct taken_events *q;
	ssize_t n = 0;
	sigset_t saved;

	*served = 0;
	lock(&saved);
	q = queue_of(fd);
	if (q && !is_inotify(fd)) {	/* closed and its number reused */
		q->off = q->len = 0;
		q->own_events = 0;
		release_if_done(q);
	} else if (q && q->len > q->off) {
		n = read_taken(q, buf, count);
		*served = 1;
	}
	unlock(&saved);
	return n;
}

/* What the kernel gave fd, our own watch's events cut out. */
static size_t without_own(int fd, char *buf, size_t len)
{
	struct taken_events *q;
	sigset_t saved;

	lock(&saved);
	q = queue_of(fd);
	if (q) {
		len = cut_own(q, buf, len);
		release_if_done(q);
	}
	unlock(&saved);
	return len;
}

/* The taken events first, then the kernel's, without our own: a read that
 * gets only ours reads again, or says EAGAIN when the fd does not block. */
static ssize_t read_after_taking(int fd, char *buf, size_t count)
{
	int served;
	ssize_t n = read_taken_of(fd, buf, count, &served);

	if (served)
		return n;
	for (;;) {
		n = __read(fd, buf, count);
		if (n <= 0)
			return n;
		n = (ssize_t)without_own(fd, buf, (size_t)n);
		if (n > 0)
			return n;
		if (fcntl(fd, F_GETFL) & O_NONBLOCK) {
			errno = EAGAIN;
			return -1;
		}
	}
}

/* The checkpoint thread's fds are its own (their numbers are not the
 * program's), and a forked writer's are that thread's. */
SHIM_EXPORT ssize_t read(int fd, void *buf, size_t count)
{
	if (!__atomic_load_n(&queues_used, __ATOMIC_ACQUIRE) || !queue_of(fd) ||
	    checkpointer_is_current() || image_writer_process())
		return __read(fd, buf, count);
	return read_after_taking(fd, buf, count);
}

/* read() of a program built with _FORTIFY_SOURCE, whose buffer size the
 * compiler knew */
SHIM_EXPORT ssize_t __read_chk(int fd, void *buf, size_t count, size_t buf_size)
{
	if (count > buf_size)
		__chk_fail();
	return read(fd, buf, count);
}
