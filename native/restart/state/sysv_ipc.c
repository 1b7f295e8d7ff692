/*
 * System V semaphore sets and message queues (saved by
 * native/shim/state/sysv_ipc.c), recreated with their ids, keys and permissions
 * in the restart's IPC namespace before any process of the job exists:
 * semaphores with their values, queues with their messages in order.
 * What SEM_UNDO would undo at exit is not saved.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <unistd.h>
#include "restart.h"

static const struct ckpt_sysv_message *next_message(const struct ckpt_sysv_message *m)
{
	return (const void *)((const char *)(m + 1) + ((m->len + 7) & ~7ULL));
}

/* At load, before anything is made: every count inside its record. */
void sysv_ipc_check(const struct image *img, const struct sysv_object *o)
{
	if (o->type == CKPT_REC_SYSV_SEM) {
		const struct ckpt_sysv_sem *h = (const void *)o->data;

		if (o->size < sizeof(*h) || h->id < 0 || h->nsems < 1 ||
		    h->nsems > CKPT_SYSV_MAX_SEMS || o->size != sizeof(*h) + 2ULL * h->nsems)
			die("%s: corrupt System V semaphore record", img->file);
	} else {
		const struct ckpt_sysv_msg *h = (const void *)o->data;
		const char *end = o->data + o->size;
		const struct ckpt_sysv_message *m;

		if (o->size < sizeof(*h) || h->id < 0 || h->nmsgs > CKPT_SYSV_MAX_MSGS)
			die("%s: corrupt System V message queue record", img->file);
		m = (const void *)(h + 1);
		for (uint32_t i = 0; i < h->nmsgs; i++, m = next_message(m))
			if ((const char *)(m + 1) > end || m->len > (uint64_t)(end - (const char *)(m + 1)) ||
			    m->type < 1)
				die("%s: corrupt System V message record", img->file);
	}
}

/* The id the next object of the kind gets (Linux's <kind>_next_id). */
static void next_id(const char *kind, int id)
{
	char path[64], text[16];
	int fd, n;

	snprintf(path, sizeof(path), "/proc/sys/kernel/%s_next_id", kind);
	n = snprintf(text, sizeof(text), "%d", id);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, text, n) != n)
		die("cannot give System V %s %d its id back (%s): %s", kind, id, path, strerror(errno));
	close(fd);
}

static void create_sem(const struct ckpt_sysv_sem *h)
{
	int id;

	next_id("sem", h->id);
	id = semget(h->key ? h->key : IPC_PRIVATE, h->nsems, IPC_CREAT | IPC_EXCL | (h->mode & 0777));
	if (id != h->id)
		die("cannot recreate System V semaphore set %d: %s", h->id,
		    id < 0 ? strerror(errno) : "it got another id");
	if (semctl(id, 0, SETALL, (unsigned short *)(h + 1)))
		die("cannot restore System V semaphore set %d: %s", h->id, strerror(errno));
}

static void create_msg(const struct ckpt_sysv_msg *h)
{
	const struct ckpt_sysv_message *m = (const void *)(h + 1);
	struct msqid_ds ds;
	int id;

	next_id("msg", h->id);
	id = msgget(h->key ? h->key : IPC_PRIVATE, IPC_CREAT | IPC_EXCL | (h->mode & 0777));
	if (id != h->id)
		die("cannot recreate System V message queue %d: %s", h->id,
		    id < 0 ? strerror(errno) : "it got another id");
	if (msgctl(id, IPC_STAT, &ds) == 0 && ds.msg_qbytes != h->qbytes) {
		ds.msg_qbytes = h->qbytes;
		if (msgctl(id, IPC_SET, &ds))
			die("cannot give System V message queue %d its size of %llu bytes: %s", h->id,
			    (unsigned long long)h->qbytes, strerror(errno));
	}
	for (uint32_t i = 0; i < h->nmsgs; i++, m = next_message(m)) {
		/* msgsnd's buffer: the type, then the text, which follows it */
		char *buf = arena_alloc(sizeof(long) + m->len);

		memcpy(buf, &m->type, sizeof(long));
		memcpy(buf + sizeof(long), m + 1, m->len);
		if (msgsnd(id, buf, m->len, IPC_NOWAIT))
			die("cannot refill System V message queue %d: %s", h->id, strerror(errno));
	}
}

/* In the restart's IPC namespace, once: each host saved its own. */
void sysv_ipc_create(struct image *imgs, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		for (unsigned k = 0; k < imgs[i].nsysv; k++) {
			const struct sysv_object *o = &imgs[i].sysv[k];

			if (o->type == CKPT_REC_SYSV_SEM)
				create_sem((const void *)o->data);
			else
				create_msg((const void *)o->data);
		}
}
