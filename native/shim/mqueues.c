/*
 * POSIX message queues.  An fd of one is a file of the IPC namespace's
 * mqueue filesystem (known by its magic; its link names the queue).  Its
 * attributes come from mq_getattr; its messages can only be read by
 * taking them, so one process per host and checkpoint (the one that
 * claims "mq:<checkpoint>:<host>:<inode>") takes them all, while the job
 * is stopped, and sends them back at once in the order it took them
 * (highest priority first, then oldest first: the queue's own order).
 * Restored by shared.c and fds.c in native/restart.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <mqueue.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include "shim.h"

#define MQUEUE_MAGIC 0x19800202

int is_mqueue(int fd)
{
	struct statfs sf;
	int ours = app_getfd(fd);
	int yes;

	if (ours < 0)
		return 0;
	yes = fstatfs(ours, &sf) == 0 && sf.f_type == MQUEUE_MAGIC;
	close(ours);
	return yes;
}

/* Queues saved by this fd table's collection: another fd of one holds no
 * messages of its own. */
#define SAVED_MAX 64
static uint64_t saved[SAVED_MAX];
static unsigned nsaved;

void mqueues_collect_begin(void)
{
	nsaved = 0;
}

static int saved_already(uint64_t ino)
{
	for (unsigned i = 0; i < nsaved; i++)
		if (saved[i] == ino)
			return 1;
	if (nsaved < SAVED_MAX)
		saved[nsaved++] = ino;
	return 0;
}

static int claim(unsigned seq, uint64_t ino)
{
	char key[200], value[16], owner[16];

	snprintf(key, sizeof(key), "mq:%u:%s:%llu", seq, shim_hostname(), (unsigned long long)ino);
	snprintf(value, sizeof(value), "%d", getpid());
	return !(kv_claim(key, value, owner, sizeof(owner)) == EEXIST && atoi(owner) != getpid());
}

/* Take every message (q gets them), then give them back in that order. */
static int take_and_give_back(mqd_t mq, const struct mq_attr *a, struct fd_payload *q)
{
	size_t each = sizeof(struct ckpt_mq_message) + ((a->mq_msgsize + 7) & ~7L);
	size_t off;
	int err = 0;

	q->cap = (a->mq_curmsgs + 1) * each;
	q->data = scratch_map(q->cap);
	if (!q->data)
		return ENOMEM;
	for (long i = 0; i < a->mq_curmsgs; i++) {
		struct ckpt_mq_message m;
		unsigned prio;
		ssize_t n = mq_receive(mq, q->data + q->len + sizeof(m), a->mq_msgsize, &prio);

		if (n < 0) {
			err = errno == EAGAIN ? 0 : errno;	/* taken by someone outside the job */
			break;
		}
		m = (struct ckpt_mq_message){ .prio = prio, .len = n };
		memcpy(q->data + q->len, &m, sizeof(m));
		q->len += sizeof(m) + ((n + 7) & ~7L);
	}
	for (off = 0; off < q->len;) {
		struct ckpt_mq_message m;

		memcpy(&m, q->data + off, sizeof(m));
		if (mq_send(mq, q->data + off + sizeof(m), m.len, m.prio) && !err)
			err = errno;
		off += sizeof(m) + ((m.len + 7) & ~7UL);
	}
	return err;
}

/* rec->path is the queue's name already ("/name", " (deleted)" cut). */
int mqueue_describe(int fd, unsigned seq, struct ckpt_fd *rec, struct fd_payload *q)
{
	struct mq_attr a;
	struct stat st;
	int ours = app_getfd(fd), rw, err = 0;
	char path[64];

	if (ours < 0)
		return errno;
	if (fstat(ours, &st) || mq_getattr(ours, &a)) {
		err = errno;
		close(ours);
		return err;
	}
	close(ours);
	rec->kind = CKPT_FD_MQUEUE;
	rec->object_id = shim_object_id(st.st_dev, st.st_ino);
	rec->value[0] = a.mq_maxmsg;
	rec->value[1] = a.mq_msgsize;
	if (!a.mq_curmsgs || !claim(seq, st.st_ino) || saved_already(st.st_ino))
		return 0;
	/* a descriptor of our own that may read and write, not blocking */
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", getpid(), fd);
	rw = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
	if (rw < 0)
		return errno;
	err = take_and_give_back(rw, &a, q);
	close(rw);
	rec->value[2] = 1;
	return err;
}
