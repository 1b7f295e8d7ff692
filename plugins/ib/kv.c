/* See kv.h. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ckpt_kv.h"
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

int ib_kv_request(const char *request, char *answer, size_t size)
{
	int err = 0;

	pthread_mutex_lock(&kv_lock);
	kv_requests++;
	if (kv_fd < 0) {
		int fd = kv_connect(coordinator_path());

		if (fd < 0)
			err = -fd;
		else
			kv_fd = fd;
	}
	if (!err)
		err = kv_fd_request(&kv_fd, request, answer, size);
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

/* ib_kv_request as a kv_request_fn */
static int request(void *conn, const char *request, char *answer, size_t size)
{
	return ib_kv_request(request, answer, size);
}

static const struct kv_client client = { request, NULL };

int ib_kv_get(const char *key, char *value, size_t size)
{
	int err = kv_client_get(&client, key, value, size);

	return err == ENOSPC ? EPROTO : err;
}

int ib_kv_claim(const char *key, const char *value)
{
	char owner[128];

	return kv_client_claim(&client, key, value, owner, sizeof(owner));
}

int ib_kv_count_in(unsigned seq, const char *what, long *count)
{
	char key[128];

	snprintf(key, sizeof(key), "ib:%u:%s", seq, what);
	return kv_client_incr(&client, key, count);
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
	char key[128];

	snprintf(key, sizeof(key), "ib:%u:%s", seq, what);
	return kv_client_await(&client, seconds, key, n);
}
