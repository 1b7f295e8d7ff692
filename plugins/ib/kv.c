/* See kv.h. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>
#include "kv.h"

static pthread_mutex_t kv_lock = PTHREAD_MUTEX_INITIALIZER;
static int kv_fd = -1;
static unsigned long kv_requests;	/* for the benchmark: rounds per rebuild */

unsigned long ib_kv_requests(void)
{
	return kv_requests;
}

/* Looked up at start-up: the hooks run on the shim's checkpoint thread,
 * which must never call dlsym (its loader lock, checkpointer.c). */
static const char *(*coordinator_path_fn)(void);

void ib_kv_init(void)
{
	coordinator_path_fn = (const char *(*)(void))dlsym(RTLD_DEFAULT, "ckpt_coordinator_path");
}

static const char *coordinator_path(void)
{
	return coordinator_path_fn ? coordinator_path_fn() : NULL;
}

static int kv_connect(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	const char *path = coordinator_path();
	int fd;

	if (!path || !*path || strlen(path) >= sizeof(sa.sun_path))
		return ENOTCONN;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return errno;
	/* raw: the shim's connect() would look the real one up with dlsym */
	if (syscall(SYS_connect, fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    write(fd, "KV\n", 3) != 3) {
		int err = errno;

		close(fd);
		return err;
	}
	kv_fd = fd;
	return 0;
}

static int write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return EPIPE;
		p += w;
		n -= w;
	}
	return 0;
}

/* One line; bytes are read one at a time: answers are short and rare. */
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
		if (n + 1 < size)
			buf[n++] = c;
	}
	buf[n] = '\0';
	return 0;
}

int ib_kv_request(const char *request, char *answer, size_t size)
{
	int err = 0;

	pthread_mutex_lock(&kv_lock);
	kv_requests++;
	if (kv_fd < 0)
		err = kv_connect();
	if (!err)
		err = write_all(kv_fd, request, strlen(request));
	if (!err)
		err = write_all(kv_fd, "\n", 1);
	if (!err)
		err = read_line(kv_fd, answer, size);
	if (err && kv_fd >= 0) {
		close(kv_fd);
		kv_fd = -1;
	}
	pthread_mutex_unlock(&kv_lock);
	return err;
}

/* In a forked child: another thread of the parent may have held the lock. */
void ib_kv_forget(void)
{
	pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;

	kv_lock = fresh;
	if (kv_fd >= 0)
		close(kv_fd);
	kv_fd = -1;
}

void ib_kv_reset(void)
{
	pthread_mutex_lock(&kv_lock);
	if (kv_fd >= 0)
		close(kv_fd);
	kv_fd = -1;
	pthread_mutex_unlock(&kv_lock);
}

int ib_kv_batch_flush(struct ib_kv_batch *b)
{
	char answer[64];
	int err;

	if (b->len > strlen("MPUT")) {
		err = ib_kv_request(b->line, answer, sizeof(answer));
		if (!err && strcmp(answer, "OK"))
			err = EPROTO;
		if (err && !b->err)
			b->err = err;
	}
	strcpy(b->line, "MPUT");
	b->len = 4;
	return b->err;
}

void ib_kv_batch_put(struct ib_kv_batch *b, const char *key, const char *value)
{
	size_t add = strlen(key) + strlen(value) + 2;

	if (!b->len)
		ib_kv_batch_flush(b);
	if (b->len + add >= sizeof(b->line))
		ib_kv_batch_flush(b);
	b->len += snprintf(b->line + b->len, sizeof(b->line) - b->len, " %s %s", key, value);
}

int ib_kv_get(const char *key, char *value, size_t size)
{
	char request[256], answer[512];
	int err;

	snprintf(request, sizeof(request), "GET %s", key);
	err = ib_kv_request(request, answer, sizeof(answer));
	if (err)
		return err;
	if (!strcmp(answer, "NONE"))
		return ENOENT;
	if (strncmp(answer, "VAL ", 4) || strlen(answer + 4) >= size)
		return EPROTO;
	strcpy(value, answer + 4);
	return 0;
}

int ib_kv_count_in(unsigned seq, const char *what, long *count)
{
	char request[128], answer[64];
	int err;

	snprintf(request, sizeof(request), "INCR ib:%u:%s", seq, what);
	err = ib_kv_request(request, answer, sizeof(answer));
	if (!err && strncmp(answer, "VAL ", 4))
		err = EPROTO;
	if (!err && count)
		*count = strtol(answer + 4, NULL, 10);
	return err;
}

int ib_kv_members(unsigned seq, long *count)
{
	char key[64], value[32];
	int err;

	snprintf(key, sizeof(key), "ib:%u:members", seq);
	err = ib_kv_get(key, value, sizeof(value));
	if (!err)
		*count = strtol(value, NULL, 10);
	return err;
}

int ib_kv_await(unsigned seq, const char *what, long n, int seconds)
{
	char request[128], answer[64];
	int err;

	snprintf(request, sizeof(request), "AWAIT %d ib:%u:%s %ld", seconds, seq, what, n);
	err = ib_kv_request(request, answer, sizeof(answer));
	if (!err && strncmp(answer, "VAL ", 4))
		err = ETIMEDOUT;
	return err;
}
