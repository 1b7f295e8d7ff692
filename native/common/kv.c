/*
 * The name service's requests and answers (ckpt_kv.h), and a "KV"
 * connection of one's own.  Answers are "OK", "VAL <value>" or "NONE".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>
#include "ckpt_kv.h"
#include "ckpt_io.h"

#define KV_REQUEST_MAX 4096

int kv_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, err;

	if (!path || !*path || strlen(path) >= sizeof(sa.sun_path))
		return -ENOTCONN;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (syscall(SYS_connect, fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		err = errno;
		close(fd);
		return -err;
	}
	err = ckpt_write_all(fd, "KV\n", 3);
	if (err) {
		close(fd);
		return -err;
	}
	return fd;
}

/* One line, a byte at a time (answers are short, and nothing after the
 * answer may be taken from the socket); EMSGSIZE if it does not fit. */
static int read_line(int fd, char *buf, size_t size)
{
	size_t n = 0;

	for (;;) {
		char c;
		ssize_t r = read(fd, &c, 1);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return EPIPE;
		if (c == '\n')
			break;
		if (n + 1 >= size)
			return EMSGSIZE;
		buf[n++] = c;
	}
	buf[n] = '\0';
	return 0;
}

int kv_fd_request(void *conn, const char *request, char *answer, size_t size)
{
	int fd = *(int *)conn;
	int err = ckpt_write_all(fd, request, strlen(request));

	if (!err)
		err = ckpt_write_all(fd, "\n", 1);
	return err ? err : read_line(fd, answer, size);
}

/* Format a request and send it: the answer in answer. */
static int ask(const struct kv_client *kv, char *answer, size_t size, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int ask(const struct kv_client *kv, char *answer, size_t size, const char *fmt, ...)
{
	char request[KV_REQUEST_MAX];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(request, sizeof(request), fmt, ap);
	va_end(ap);
	if (n < 0 || n >= (int)sizeof(request))
		return EMSGSIZE;
	return kv->request(kv->conn, request, answer, size);
}

/* The value of a "VAL <value>" answer, or NULL. */
static const char *value_of(const char *answer)
{
	return strncmp(answer, "VAL ", 4) ? NULL : answer + 4;
}

static int copy_value(const char *value, char *out, size_t size)
{
	if (strlen(value) >= size)
		return ENOSPC;
	strcpy(out, value);
	return 0;
}

int kv_client_put(const struct kv_client *kv, const char *key, const char *value)
{
	char answer[64];
	int err = ask(kv, answer, sizeof(answer), "PUT %s %s", key, value);

	return err ? err : strcmp(answer, "OK") ? EPROTO : 0;
}

int kv_client_get(const struct kv_client *kv, const char *key, char *value, size_t size)
{
	char answer[KV_ANSWER_MAX];
	int err = ask(kv, answer, sizeof(answer), "GET %s", key);

	if (err)
		return err;
	if (!strcmp(answer, "NONE"))
		return ENOENT;
	return value_of(answer) ? copy_value(value_of(answer), value, size) : EPROTO;
}

int kv_client_claim(const struct kv_client *kv, const char *key, const char *value,
		    char *owner, size_t size)
{
	char answer[KV_ANSWER_MAX];
	int err = ask(kv, answer, sizeof(answer), "CLAIM %s %s", key, value);

	if (err)
		return err;
	if (!strcmp(answer, "OK"))
		return 0;
	if (!value_of(answer))
		return EPROTO;
	err = copy_value(value_of(answer), owner, size);
	return err ? EPROTO : EEXIST;
}

int kv_client_mwait(const struct kv_client *kv, int seconds, const char *keys,
		    char *values, size_t size)
{
	char answer[KV_ANSWER_MAX];
	int err = ask(kv, answer, sizeof(answer), "MWAIT %d %s", seconds, keys);

	if (err)
		return err;
	if (value_of(answer))
		return values ? copy_value(value_of(answer), values, size) : 0;
	return strncmp(answer, "NONE", 4) ? EPROTO : ETIMEDOUT;
}

int kv_client_incr(const struct kv_client *kv, const char *key, long *count)
{
	char answer[64];
	int err = ask(kv, answer, sizeof(answer), "INCR %s", key);

	if (!err && !value_of(answer))
		err = EPROTO;
	if (!err && count)
		*count = strtol(value_of(answer), NULL, 10);
	return err;
}

int kv_client_await(const struct kv_client *kv, int seconds, const char *key, long n)
{
	char answer[64];
	int err = ask(kv, answer, sizeof(answer), "AWAIT %d %s %ld", seconds, key, n);

	return err ? err : value_of(answer) ? 0 : ETIMEDOUT;
}
