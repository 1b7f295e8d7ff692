/*
 * POSIX message queues.  An fd of one is a file of the IPC namespace's
 * mqueue filesystem (known by its magic; its link names the queue).  Its
 * attributes come from mq_getattr; its messages can only be read by
 * taking them, so one process per host and checkpoint (the one that
 * claims "mq:<checkpoint>:<host>:<inode>") takes them all, while the job
 * is stopped, and sends them back at once in the order it took them
 * (highest priority first, then oldest first: the queue's own order).
 * A queue that no fd holds lives on by its name until mq_unlink: the
 * names this process created are remembered (mq_open with O_CREAT), and
 * each that still exists and that no fd of the process holds is saved
 * the same way through an fd of our own, in a record of its own.
 * Restored by mqueues.c, shared.c and fds.c in native/restart.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <sys/syscall.h>
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

/* Through /proc, not an fd of ours: closing one would drop the process's
 * mq_notify registration (below). */
int is_mqueue(int fd)
{
	struct statfs sf;
	char path[64];

	snprintf(path, sizeof(path), "/proc/%d/fd/%d", getpid(), fd);
	return statfs(path, &sf) == 0 && sf.f_type == MQUEUE_MAGIC;
}

/* Queues saved by this fd table's collection (inodes): another fd of one
 * holds no messages of its own; and the queues its fds hold (object ids),
 * which need no record by name. */
#define SAVED_MAX 64
static uint64_t saved[SAVED_MAX], held[SAVED_MAX];
static unsigned nsaved, nheld;

static unsigned nsaved_registrations;

void mqueues_collect_begin(void)
{
	nsaved = 0;
	nheld = 0;
	nsaved_registrations = 0;
}

static int listed(const uint64_t *list, unsigned n, uint64_t ino)
{
	for (unsigned i = 0; i < n; i++)
		if (list[i] == ino)
			return 1;
	return 0;
}

static int saved_already(uint64_t ino)
{
	if (listed(saved, nsaved, ino))
		return 1;
	if (nsaved < SAVED_MAX)
		saved[nsaved++] = ino;
	return 0;
}

static int claim(unsigned seq, uint64_t ino)
{
	char key[200];

	snprintf(key, sizeof(key), "mq:%u:%s:%llu", seq, shim_hostname(), (unsigned long long)ino);
	return kv_claim_mine(key);
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

/*
 * mq_notify registrations.  The queue's file tells whether one is there
 * and whose ("NOTIFY:<how> SIGNO:<sig> NOTIFY_PID:<pid>"), not the value
 * its signal carries: the shim's mq_notify remembers that.  A SIGEV_THREAD
 * registration lives on glibc's netlink socket and helper thread, which a
 * restart does not make again: it is dropped, and the user told.
 */
#define NOTIFY_MAX 64

static struct registration {
	int fd;
	int notify, signo;
	uint64_t value;
} registrations[NOTIFY_MAX];
static unsigned nregistrations;

static struct registration *registration_of(int fd)
{
	for (unsigned i = 0; i < nregistrations; i++)
		if (registrations[i].fd == fd)
			return &registrations[i];
	return NULL;
}

SHIM_EXPORT int mq_notify(mqd_t mq, const struct sigevent *sev)
{
	typedef int (*fn)(mqd_t, const struct sigevent *);
	static fn real;
	struct registration *r;

	if (!real)
		real = (fn)dlsym(RTLD_NEXT, "mq_notify");
	if (real(mq, sev))
		return -1;
	r = registration_of(mq);
	if (!r && nregistrations < NOTIFY_MAX)
		r = &registrations[nregistrations++];
	if (r)
		*r = (struct registration){ mq, sev ? sev->sigev_notify : -1,
					    sev ? sev->sigev_signo : 0,
					    sev ? (uint64_t)(uintptr_t)sev->sigev_value.sival_ptr : 0 };
	return 0;
}

/*
 * The kernel drops a registration when any fd of its queue is closed by
 * its process: the checkpoint thread's own fds count.  So a parked thread
 * of the application reads it through the application's own fd first,
 * and makes it again once the checkpoint thread is done with the queue.
 */
struct notify_work {
	int fd;
	int how, signo;			/* SIGEV_* + 1 (0: none of ours) */
	uint64_t value;
	char text[160];
};

static void read_in_app(void *arg)
{
	struct notify_work *w = arg;
	ssize_t n = syscall(SYS_pread64, w->fd, w->text, sizeof(w->text) - 1, 0);

	w->text[n > 0 ? n : 0] = '\0';
}

static void register_in_app(void *arg)
{
	const struct notify_work *w = arg;
	struct sigevent sev = { .sigev_notify = w->how - 1, .sigev_signo = w->signo };

	sev.sigev_value.sival_ptr = (void *)(uintptr_t)w->value;
	syscall(SYS_mq_notify, w->fd, &sev);
}

static int field(const char *text, const char *name)
{
	const char *p = strstr(text, name);

	return p ? atoi(p + strlen(name)) : 0;
}

/* This process's registration on fd's queue, into rec->value[4] (how +
 * 1, signal << 8) and value[5] (the signal's value). */
static int save_registration(int fd, struct ckpt_fd *rec)
{
	struct notify_work w = { .fd = fd };
	const struct registration *r;
	int err = quiesce_run_in_app(read_in_app, &w);

	if (err || field(w.text, "NOTIFY_PID:") != getpid())
		return err;
	w.how = field(w.text, "NOTIFY:") + 1;
	w.signo = field(w.text, "SIGNO:");
	if (w.how - 1 == SIGEV_THREAD) {
		ckpt_warn("fd %d (a message queue): its mq_notify(SIGEV_THREAD) registration "
			  "cannot be restored: it is dropped at restart", fd);
		return 0;
	}
	r = registration_of(fd);
	rec->value[4] = w.how | (uint64_t)w.signo << 8;
	/* the registration the wrapper saw: its value too */
	rec->value[5] = r && r->notify == w.how - 1 && r->signo == w.signo ? r->value : 0;
	return 0;
}

/* The registrations of this checkpoint's image, for after_restart. */
static struct notify_work saved_registrations[NOTIFY_MAX];

static int register_again(int fd, const struct ckpt_fd *rec)
{
	struct notify_work w = { .fd = fd, .how = rec->value[4] & 0xff,
				 .signo = rec->value[4] >> 8, .value = rec->value[5] };

	if (!rec->value[4])
		return 0;
	if (nsaved_registrations < NOTIFY_MAX)
		saved_registrations[nsaved_registrations++] = w;
	return quiesce_run_in_app(register_in_app, &w);
}

/* After a restart: ckpt-restart registered them again (restore_mq_notify,
 * native/restart/state/mqueues.c), but the checkpoint thread's closing of its
 * copy of the fd table dropped them. */
void mqueues_restarted(void)
{
	for (unsigned i = 0; i < nsaved_registrations; i++)
		quiesce_run_in_app(register_in_app, &saved_registrations[i]);
}

/* The queue's attributes into rec.  Returns 1 if this process is the
 * host's saver of its messages, 0 if not, or -errno. */
static int describe_queue(int fd, unsigned seq, struct ckpt_fd *rec, struct mq_attr *a)
{
	struct stat st;

	if (fstat(fd, &st) || mq_getattr(fd, a))
		return -errno;
	rec->kind = CKPT_FD_MQUEUE;
	rec->object_id = shim_object_id(st.st_dev, st.st_ino);
	rec->value[0] = a->mq_maxmsg;
	rec->value[1] = a->mq_msgsize;
	return a->mq_curmsgs && claim(seq, st.st_ino) && !saved_already(st.st_ino);
}

/* rw: an fd of our own on the queue that may read and write, not blocking. */
static int take_messages(int rw, const struct mq_attr *a, struct ckpt_fd *rec,
			 struct fd_payload *q)
{
	rec->value[2] = 1;
	return take_and_give_back(rw, a, q);
}

/* rec->path is the queue's name already ("/name", " (deleted)" cut). */
int mqueue_describe(int fd, unsigned seq, struct ckpt_fd *rec, struct fd_payload *q)
{
	struct mq_attr a;
	int ours, rw, take, err = save_registration(fd, rec);
	char path[64];

	if (err)
		return err;
	ours = app_getfd(fd);
	if (ours < 0)
		return errno;
	take = describe_queue(ours, seq, rec, &a);
	close(ours);
	if (take < 0)
		return -take;
	if (nheld < SAVED_MAX)
		held[nheld++] = rec->object_id;
	if (take) {
		snprintf(path, sizeof(path), "/proc/%d/fd/%d", getpid(), fd);
		rw = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
		if (rw < 0)
			return errno;
		err = take_messages(rw, &a, rec, q);
		close(rw);
	}
	return err ? err : register_again(fd, rec);
}

/* ---- queues known by name alone ---- */

#define NAMES_MAX 64
static char created[NAMES_MAX][NAME_MAX + 2];	/* "/name"; "" = free */
static pthread_mutex_t created_lock = PTHREAD_MUTEX_INITIALIZER;

static void remember_name(const char *name, int keep)
{
	int free_slot = -1;

	if (strlen(name) > NAME_MAX)
		return;
	pthread_mutex_lock(&created_lock);
	for (int i = 0; i < NAMES_MAX; i++) {
		if (!strcmp(created[i], name)) {
			if (!keep)
				created[i][0] = '\0';
			goto out;
		}
		if (!created[i][0] && free_slot < 0)
			free_slot = i;
	}
	if (keep && free_slot >= 0)
		strcpy(created[free_slot], name);
out:
	pthread_mutex_unlock(&created_lock);
}

SHIM_EXPORT mqd_t mq_open(const char *name, int oflag, ...)
{
	typedef mqd_t (*fn)(const char *, int, ...);
	static fn real;
	struct mq_attr *attr = NULL;
	mode_t mode = 0;
	mqd_t q;

	if (!real)
		real = (fn)dlsym(RTLD_NEXT, "mq_open");
	if (oflag & O_CREAT) {
		va_list ap;

		va_start(ap, oflag);
		mode = va_arg(ap, mode_t);
		attr = va_arg(ap, struct mq_attr *);
		va_end(ap);
	}
	q = real(name, oflag, mode, attr);
	if (q >= 0 && (oflag & O_CREAT))
		remember_name(name, 1);
	return q;
}

SHIM_EXPORT int mq_unlink(const char *name)
{
	typedef int (*fn)(const char *);
	static fn real;

	if (!real)
		real = (fn)dlsym(RTLD_NEXT, "mq_unlink");
	if (real(name))
		return -1;
	remember_name(name, 0);
	return 0;
}

/* Slot i of the names this process created ("" when free), NULL past
 * the last slot. */
const char *mqueue_created(unsigned i)
{
	return i < NAMES_MAX ? created[i] : NULL;
}

/*
 * A queue this process created, by its name: ENOENT when it is gone,
 * EEXIST when an fd of the process holds it (its fd record makes it
 * again).  Called after the fd table's queues were described.
 */
int mqueue_describe_name(const char *name, unsigned seq, struct ckpt_fd *rec,
			 struct fd_payload *q)
{
	/* the mode it was made with may keep even its creator out */
	static const int modes[] = { O_RDWR, O_RDONLY, O_WRONLY };
	int fd = -1, rw, take, err = 0;
	struct mq_attr a;
	struct stat st;

	errno = EACCES;
	for (unsigned i = 0; fd < 0 && errno == EACCES && i < 3; i++) {
		fd = syscall(SYS_mq_open, name + 1, modes[i] | O_NONBLOCK | O_CLOEXEC, 0, NULL);
		rw = i == 0;
	}
	if (fd < 0)
		return errno;
	if (fstat(fd, &st)) {
		err = errno;
		goto out;
	}
	if (listed(held, nheld, shim_object_id(st.st_dev, st.st_ino))) {
		err = EEXIST;
		goto out;
	}
	rec->mode = st.st_mode;
	rec->flags = O_RDWR;
	take = describe_queue(fd, seq, rec, &a);
	if (take < 0)
		err = -take;
	else if (take && rw)
		err = take_messages(fd, &a, rec, q);
	else if (take)
		ckpt_warn("message queue %s: its mode lets its creator not read and write it: "
			  "its %ld messages are not saved", name, (long)a.mq_curmsgs);
out:
	close(fd);
	return err;
}
