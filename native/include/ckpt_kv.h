/*
 * A client of the coordinator's name service (docs/PROTOCOL.md, "Name
 * service"): the requests and their answers, shared by the shim (over its
 * checkpoint connection), ckpt-restart, ckpt-remote and the IB plugin
 * (over a connection of their own that starts with the line "KV").
 *
 * The transport is the caller's: a kv_client names a function that sends
 * one request line and returns its one-line answer, so that each caller
 * keeps its own locking and error policy.  No malloc, no stdio streams.
 */
#ifndef CKPT_KV_H
#define CKPT_KV_H

#include <stddef.h>

#define KV_ANSWER_MAX 4096

/* Send request (one line, no newline) and read the answer line into
 * answer (terminated, without the newline): 0 or an errno. */
typedef int (*kv_request_fn)(void *conn, const char *request, char *answer, size_t size);

struct kv_client {
	kv_request_fn request;
	void *conn;
};

/* A "KV" connection of one's own to the Unix socket at path (the job's
 * coordinator or its host agent): the fd, or -errno.  The raw connect
 * system call: the shim's connect() would look the real one up with dlsym. */
int kv_connect(const char *path);
/* kv_request_fn over such a connection: conn points to the fd. */
int kv_fd_request(void *conn, const char *request, char *answer, size_t size);

/* PUT: 0, or EPROTO if refused. */
int kv_client_put(const struct kv_client *kv, const char *key, const char *value);
/* GET: 0 with value, ENOENT, ENOSPC (value too small) or EPROTO. */
int kv_client_get(const struct kv_client *kv, const char *key, char *value, size_t size);
/* CLAIM: 0 if key is now ours, EEXIST with owner's value filled. */
int kv_client_claim(const struct kv_client *kv, const char *key, const char *value,
		    char *owner, size_t size);
/* MWAIT: until every key (space separated) is there: 0 with their values
 * (space separated) in values if given, or ETIMEDOUT after seconds. */
int kv_client_mwait(const struct kv_client *kv, int seconds, const char *keys,
		    char *values, size_t size);
/* INCR: the count with this one, in *count if given. */
int kv_client_incr(const struct kv_client *kv, const char *key, long *count);
/* AWAIT: until the count of key reaches n: 0, or ETIMEDOUT. */
int kv_client_await(const struct kv_client *kv, int seconds, const char *key, long n);

#endif
