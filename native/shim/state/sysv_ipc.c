/*
 * System V semaphore sets and message queues: they belong to the IPC
 * namespace, not to a process, so one process per host and checkpoint
 * (the one that claims "sysv:<checkpoint>:<host>") saves those of its
 * user, while the job is stopped: semaphore values with GETALL, messages
 * with MSG_COPY (read without taking them).  Restored by
 * native/restart/state/sysv_ipc.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <unistd.h>
#include "shim.h"

#ifndef MSG_COPY
#define MSG_COPY 040000
#endif

#define LIST_MAX (1 << 20)

/* The records to write: [type u32, pad u32, size u64, payload] ... */
struct sysv_snapshot {
	char *buf;
	size_t len, cap;
};

static int grow(struct sysv_snapshot *s, size_t more)
{
	size_t cap = s->cap ? s->cap : 1 << 16;
	char *buf;

	if (s->len + more <= s->cap)
		return 0;
	while (cap < s->len + more)
		cap *= 2;
	buf = scratch_map(cap);
	if (!buf)
		return ENOMEM;
	if (s->buf) {
		memcpy(buf, s->buf, s->len);
		scratch_unmap(s->buf, s->cap);
	}
	s->buf = buf;
	s->cap = cap;
	return 0;
}

/* A record's header; the payload is appended after it. */
static int begin_record(struct sysv_snapshot *s, uint32_t type, uint64_t size, size_t *at)
{
	uint32_t head[2] = { type, 0 };
	int err = grow(s, 16 + size + 8);

	if (err)
		return err;
	*at = s->len;
	memcpy(s->buf + s->len, head, 8);
	memcpy(s->buf + s->len + 8, &size, 8);
	s->len += 16;
	return 0;
}

static int mine(unsigned uid, unsigned cuid)
{
	return uid == geteuid() || cuid == geteuid();
}

static int save_sem(struct sysv_snapshot *s, int id, int key, unsigned mode, unsigned nsems)
{
	struct ckpt_sysv_sem h = { .id = id, .key = key, .mode = mode & 0777, .nsems = nsems };
	size_t at;
	int err;

	if (nsems > CKPT_SYSV_MAX_SEMS)
		return E2BIG;
	err = begin_record(s, CKPT_REC_SYSV_SEM, sizeof(h) + 2 * (uint64_t)nsems, &at);
	if (err)
		return err;
	memcpy(s->buf + s->len, &h, sizeof(h));
	if (semctl(id, 0, GETALL, (unsigned short *)(s->buf + s->len + sizeof(h))))
		return errno;
	s->len += (sizeof(h) + 2 * (size_t)nsems + 7) & ~7UL;	/* the next one aligned */
	return 0;
}

static long msg_max(void)
{
	char text[32] = "";
	long max = ckpt_read_file("/proc/sys/kernel/msgmax", text, sizeof(text) - 1) > 0 ?
		   atol(text) : 0;

	return max > 0 ? max : 8192;
}

static int save_msg(struct sysv_snapshot *s, int id, int key, unsigned mode, unsigned long cbytes,
		    unsigned long qnum)
{
	struct ckpt_sysv_msg h = { .id = id, .key = key, .mode = mode & 0777 };
	long max = msg_max();
	struct msqid_ds ds;
	uint64_t size;
	size_t at;
	int err;

	if (qnum > CKPT_SYSV_MAX_MSGS || msgctl(id, IPC_STAT, &ds))
		return qnum > CKPT_SYSV_MAX_MSGS ? E2BIG : errno;
	h.qbytes = ds.msg_qbytes;
	size = sizeof(h) + cbytes + qnum * (sizeof(struct ckpt_sysv_message) + 8);
	err = begin_record(s, CKPT_REC_SYSV_MSG, 0, &at);
	if (!err)
		err = grow(s, size + sizeof(long) + max);
	if (err)
		return err;
	s->len += sizeof(h);
	for (unsigned long i = 0; i < qnum; i++) {
		struct ckpt_sysv_message m;
		/* msgrcv's buffer: the type, then the text, where the text goes */
		char *at_type = s->buf + s->len + sizeof(m) - sizeof(long);
		ssize_t n = msgrcv(id, at_type, max, (long)i, IPC_NOWAIT | MSG_COPY | MSG_NOERROR);

		if (n < 0)
			return errno;
		m.type = *(long *)at_type;
		m.len = n;
		memcpy(s->buf + s->len, &m, sizeof(m));
		s->len += sizeof(m) + ((n + 7) & ~7L);
		h.nmsgs++;
		err = grow(s, sizeof(long) + max + sizeof(m));
		if (err)
			return err;
	}
	memcpy(s->buf + at + 16, &h, sizeof(h));
	size = s->len - at - 16;
	memcpy(s->buf + at + 8, &size, 8);
	return 0;
}

static int save_all(struct sysv_snapshot *s, char *list, const char *kind, char *detail,
		    size_t size)
{
	char *line = strchr(list, '\n');	/* past the header */

	while (line && *++line) {
		char *next = strchr(line, '\n');
		int key, id, err = 0;
		unsigned mode, uid, gid, cuid, cgid;
		unsigned long a, b;
		long lspid, lrpid;

		if (next)
			*next = '\0';
		if (!strcmp(kind, "sem") &&
		    sscanf(line, "%d %d %o %lu %u %u %u %u", &key, &id, &mode, &a, &uid, &gid,
			   &cuid, &cgid) == 8) {
			if (mine(uid, cuid))
				err = save_sem(s, id, key, mode, a);
		} else if (!strcmp(kind, "msg") &&
			   sscanf(line, "%d %d %o %lu %lu %ld %ld %u %u %u %u", &key, &id, &mode, &a,
				  &b, &lspid, &lrpid, &uid, &gid, &cuid, &cgid) == 11) {
			if (mine(uid, cuid))
				err = save_msg(s, id, key, mode, a, b);
		}
		if (err) {
			snprintf(detail, size, "System V %s %d: %s%s",
				 !strcmp(kind, "sem") ? "semaphore set" : "message queue", id,
				 shim_strerror(err), err == ENOSYS ? " (reading its messages without "
				 "taking them needs MSG_COPY, CONFIG_CHECKPOINT_RESTORE)" : "");
			return err;
		}
		line = next;
	}
	return 0;
}

void sysv_ipc_free(struct sysv_snapshot *s)
{
	if (!s)
		return;
	if (s->buf)
		scratch_unmap(s->buf, s->cap);
	scratch_unmap(s, sizeof(*s));
}

/* Whether this process saves them at this checkpoint (first to ask). */
static int claimed(unsigned seq)
{
	char key[160], value[16], owner[16];

	snprintf(key, sizeof(key), "sysv:%u:%s", seq, shim_hostname());
	snprintf(value, sizeof(value), "%d", getpid());
	return !(kv_claim(key, value, owner, sizeof(owner)) == EEXIST && atoi(owner) != getpid());
}

/* /proc/sysvipc/<kind> into list; whether it names any object. */
static int read_list(const char *kind, char *list)
{
	char path[32];
	ssize_t n;
	char *nl;

	snprintf(path, sizeof(path), "/proc/sysvipc/%s", kind);
	n = ckpt_read_file(path, list, LIST_MAX - 1);
	list[n > 0 ? n : 0] = '\0';	/* none: no System V IPC in this kernel */
	nl = strchr(list, '\n');
	return nl && nl[1];
}

/*
 * While the job is stopped.  Returns 0 with *out NULL when another process
 * saves them or there are none (then nobody asks the coordinator), else
 * the records to write.
 */
int sysv_ipc_snapshot(unsigned seq, struct sysv_snapshot **out, char *detail, size_t size)
{
	static const char *const kinds[] = { "sem", "msg" };
	char *lists = scratch_map(2 * LIST_MAX);
	struct sysv_snapshot *s = NULL;
	int any = 0, err = 0;

	*out = NULL;
	if (!lists) {
		snprintf(detail, size, "System V IPC: %s", shim_strerror(ENOMEM));
		return ENOMEM;
	}
	for (unsigned k = 0; k < 2; k++)
		any |= read_list(kinds[k], lists + k * LIST_MAX);
	if (any && claimed(seq)) {
		s = scratch_map(sizeof(*s));
		if (!s) {
			snprintf(detail, size, "System V IPC: %s", shim_strerror(ENOMEM));
			err = ENOMEM;
		} else {
			memset(s, 0, sizeof(*s));
		}
		for (unsigned k = 0; k < 2 && !err; k++)
			err = save_all(s, lists + k * LIST_MAX, kinds[k], detail, size);
	}
	scratch_unmap(lists, 2 * LIST_MAX);
	if (err) {
		sysv_ipc_free(s);
		return err;
	}
	*out = s;
	return 0;
}

int sysv_ipc_write(struct image_writer *w, const struct sysv_snapshot *s)
{
	int err = 0;

	for (size_t off = 0; s && off < s->len && !err;) {
		uint32_t type;
		uint64_t len;

		memcpy(&type, s->buf + off, 4);
		memcpy(&len, s->buf + off + 8, 8);
		err = iw_record(w, type, s->buf + off + 16, len);
		off = (off + 16 + len + 7) & ~7UL;
	}
	return err;
}
