/*
 * eventfd, epoll, timerfd, signalfd and pidfd: their state is in
 * /proc/self/fdinfo/N (see proc(5)), which is all the restart needs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "shim.h"

#define FDINFO_MAX (1 << 20)

static const char *field(const char *info, const char *name)
{
	const char *p = strstr(info, name);

	return p ? p + strlen(name) : NULL;
}

static void describe_eventfd(const char *info, struct ckpt_fd *rec)
{
	const char *count = field(info, "eventfd-count:");
	const char *sem = field(info, "eventfd-semaphore:");

	rec->kind = CKPT_FD_EVENTFD;
	rec->value[0] = count ? strtoull(count, NULL, 16) : 0;
	rec->value[1] = sem ? strtoull(sem, NULL, 10) : 0;
}

static void describe_timerfd(const char *info, struct ckpt_fd *rec)
{
	const char *clock = field(info, "clockid:");
	const char *flags = field(info, "settime flags:");
	const char *value = field(info, "it_value:");
	const char *interval = field(info, "it_interval:");
	const char *ticks = field(info, "ticks:");
	unsigned long long s = 0, ns = 0;

	rec->kind = CKPT_FD_TIMERFD;
	rec->value[0] = clock ? strtoull(clock, NULL, 10) : 0;
	rec->value[1] = flags ? strtoull(flags, NULL, 8) : 0;
	if (interval && sscanf(interval, " (%llu, %llu)", &s, &ns) == 2)
		rec->value[2] = s * 1000000000ULL + ns;
	if (value && sscanf(value, " (%llu, %llu)", &s, &ns) == 2)
		rec->value[3] = s * 1000000000ULL + ns;	/* time left */
	rec->value[4] = ticks ? strtoull(ticks, NULL, 10) : 0;
}

static void describe_signalfd(const char *info, struct ckpt_fd *rec)
{
	const char *mask = field(info, "sigmask:");

	rec->kind = CKPT_FD_SIGNALFD;
	rec->value[0] = mask ? strtoull(mask, NULL, 16) : 0;
}

/* A pidfd: its process ("Pid: -1" once it has exited).  Restored by
 * open_pidfd (native/restart/state/fds.c). */
static void describe_pidfd(const char *info, struct ckpt_fd *rec)
{
	const char *pid = field(info, "\nPid:");
	long n = pid ? strtol(pid, NULL, 10) : -1;

	rec->kind = CKPT_FD_PIDFD;
	rec->value[0] = n > 0 ? (uint64_t)n : 0;
}

/* The interest list: one "tfd: N events: X data: Y" line per entry. */
static int describe_epoll(const char *info, struct ckpt_fd *rec, struct fd_payload *q)
{
	size_t n = 0;

	for (const char *p = info; (p = strstr(p, "tfd:")); p += 4)
		n++;
	rec->kind = CKPT_FD_EPOLL;
	q->cap = (n + 1) * sizeof(struct ckpt_epoll_entry);
	q->data = scratch_map(q->cap);
	if (!q->data)
		return ENOMEM;
	for (const char *p = info; (p = strstr(p, "tfd:")); p += 4) {
		struct ckpt_epoll_entry e;
		unsigned events;
		unsigned long long data;
		int fd;

		if (sscanf(p, "tfd: %d events: %x data: %llx", &fd, &events, &data) != 3)
			continue;
		e = (struct ckpt_epoll_entry){ .fd = fd, .events = events, .data = data };
		memcpy(q->data + q->len, &e, sizeof(e));
		q->len += sizeof(e);
	}
	return 0;
}

int event_fd_describe(int fd, const char *link, struct ckpt_fd *rec, struct fd_payload *q)
{
	char path[64];
	char *info = scratch_map(FDINFO_MAX);
	ssize_t n;
	int err = 0;

	if (!info)
		return ENOMEM;
	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	n = ckpt_read_file(path, info, FDINFO_MAX - 1);
	if (n <= 0) {
		err = n < 0 ? -n : EIO;
		goto out;
	}
	info[n] = '\0';
	if (!strcmp(link, "anon_inode:[eventfd]"))
		describe_eventfd(info, rec);
	else if (!strcmp(link, "anon_inode:[timerfd]"))
		describe_timerfd(info, rec);
	else if (!strcmp(link, "anon_inode:[signalfd]"))
		describe_signalfd(info, rec);
	else if (!strcmp(link, "anon_inode:[pidfd]"))
		describe_pidfd(info, rec);
	else if (!strcmp(link, "anon_inode:[eventpoll]"))
		err = describe_epoll(info, rec, q);
	else if (!strcmp(link, "anon_inode:inotify"))
		err = inotify_describe(fd, info, rec, q);
	else
		err = ENOTSUP;
out:
	scratch_unmap(info, FDINFO_MAX);
	return err;
}
