/*
 * POSIX message queues (saved by native/shim/state/mqueues.c): each one made
 * once, before any process exists, in the restart's IPC namespace, with
 * its name, permissions and attributes, refilled from the one record
 * that holds its messages, and unlinked again if it was.  A queue no fd
 * held (CKPT_REC_MQUEUE) is made alike and left to its name.  Every process
 * opens its fd again through it (/proc/self/fd), with its own access
 * mode and O_NONBLOCK, as mq_open would have given it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <mqueue.h>
#include <stdio.h>
#include <string.h>
#include <signal.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "restart.h"

struct shared_mqueue {
	uint64_t id;
	int fd;
	int filled;	/* each of the saver's fds on it holds the messages */
};

static struct shared_mqueue *mqueues;
static unsigned nmqueues;

static struct shared_mqueue *find_mqueue(uint64_t id)
{
	for (unsigned i = 0; i < nmqueues; i++)
		if (mqueues[i].id == id)
			return &mqueues[i];
	return NULL;
}

static void refill(int fd, const struct loaded_fd *lf)
{
	const char *p = lf->data, *end = lf->data + lf->f.data_size;

	while (p < end) {
		struct ckpt_mq_message m;

		if ((size_t)(end - p) < sizeof(m))
			die("message queue %s: corrupt record", lf->path);
		memcpy(&m, p, sizeof(m));
		p += sizeof(m);
		if (m.len > (uint64_t)(end - p) || m.len > lf->f.value[1])
			die("message queue %s: corrupt record", lf->path);
		if (mq_send(fd, p, m.len, m.prio))
			die("cannot refill message queue %s: %s", lf->path, strerror(errno));
		p += (m.len + 7) & ~7UL;
	}
}

static int open_queue(const struct loaded_fd *lf)
{
	struct mq_attr a = { .mq_maxmsg = (long)lf->f.value[0], .mq_msgsize = (long)lf->f.value[1] };
	int fd;

	if (lf->path[0] != '/' || strchr(lf->path + 1, '/'))
		die("message queue %s: corrupt record (not a queue's name)", lf->path);
	fd = mq_open(lf->path, O_RDWR | O_CREAT | O_EXCL | O_NONBLOCK | O_CLOEXEC,
		     lf->f.mode & 0777, &a);
	if (fd < 0)
		die("cannot recreate message queue %s (%llu messages of %llu bytes): %s", lf->path,
		    (unsigned long long)a.mq_maxmsg, (unsigned long long)a.mq_msgsize,
		    strerror(errno));
	if (lf->f.value[3] && mq_unlink(lf->path))
		die("cannot unlink message queue %s again: %s", lf->path, strerror(errno));
	return move_high(fd, lf->path);
}

/* The queue of lf made once; refilled from the first record holding its
 * messages. */
static void add_queue(const struct loaded_fd *lf)
{
	struct shared_mqueue *q = find_mqueue(lf->f.object_id);

	if (!q) {
		q = &mqueues[nmqueues++];
		*q = (struct shared_mqueue){ lf->f.object_id, open_queue(lf), 0 };
	}
	if (lf->f.value[2] && !q->filled)
		refill(q->fd, lf);
	q->filled |= lf->f.value[2] != 0;
}

void mqueues_create(struct image *imgs, unsigned n)
{
	unsigned total = 0;

	for (unsigned i = 0; i < n; i++)
		total += imgs[i].nfds + imgs[i].nnamed_mqueues;
	mqueues = arena_alloc(sizeof(*mqueues) * (total + 1));
	for (unsigned i = 0; i < n; i++) {
		for (unsigned j = 0; j < imgs[i].nfds; j++) {
			const struct loaded_fd *lf = &imgs[i].fds[j];

			if (lf->f.kind == CKPT_FD_MQUEUE && lf->f.dup_of < 0)
				add_queue(lf);
		}
		for (unsigned j = 0; j < imgs[i].nnamed_mqueues; j++)
			add_queue(&imgs[i].named_mqueues[j]);
	}
}

/* This process's own fd on the queue. */
int open_mqueue(const struct ckpt_fd *f)
{
	const struct shared_mqueue *q = find_mqueue(f->object_id);
	char path[64];

	if (!q)
		return -1;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", q->fd);
	return open(path, (f->flags & (O_ACCMODE | O_NONBLOCK)) | O_CLOEXEC);
}

/*
 * Pair of save_registration (native/shim/state/mqueues.c): this process's
 * mq_notify registrations again, once the restart closed its own fds of
 * the queues (a close by the owner drops a registration).  The queues
 * were refilled before: a registration does not fire for messages that
 * were there already.
 */
void restore_mq_notify(const struct image *img)
{
	for (unsigned i = 0; i < img->nfds; i++) {
		const struct ckpt_fd *f = &img->fds[i].f;
		struct sigevent sev = { .sigev_notify = (int)(f->value[4] & 0xff) - 1,
					.sigev_signo = (int)(f->value[4] >> 8) };

		if (f->kind != CKPT_FD_MQUEUE || !f->value[4])
			continue;
		sev.sigev_value.sival_ptr = (void *)(uintptr_t)f->value[5];
		if (syscall(SYS_mq_notify, f->fd, &sev) && errno != EBUSY)
			die("pid %d: fd %d (message queue %s): cannot register its mq_notify again: %s",
			    img->hdr.pid, f->fd, img->fds[i].path, strerror(errno));
	}
}

unsigned mqueue_fds(int *out, unsigned max)
{
	unsigned k = 0;

	for (unsigned i = 0; i < nmqueues && k < max; i++)
		out[k++] = mqueues[i].fd;
	return k;
}

void mqueues_close(void)
{
	for (unsigned i = 0; i < nmqueues; i++)
		close(mqueues[i].fd);
}
