/*
 * The plugin's own connection to the coordinator's name service (a "KV"
 * connection, docs/PROTOCOL.md): the checkpoint thread's connection
 * belongs to the checkpoint thread, and verbs calls run in application
 * threads and in the plugin's agent thread.
 */
#ifndef CKPT_IB_KV_H
#define CKPT_IB_KV_H

#include <stddef.h>

/* Send one request line (no newline), read the one-line answer. 0 or errno. */
int ib_kv_request(const char *request, char *answer, size_t size);
/* Forget the connection (the coordinator changed: a restart). */
void ib_kv_reset(void);
void ib_kv_forget(void);
unsigned long ib_kv_requests(void);
void ib_kv_init(void);	/* at start-up, in the application's context */

/* A buffer of "MPUT k v k v ..." lines, sent when full or flushed. */
struct ib_kv_batch {
	char line[3800];
	size_t len;
	int err;
};

void ib_kv_batch_put(struct ib_kv_batch *b, const char *key, const char *value);
int ib_kv_batch_flush(struct ib_kv_batch *b);

/* Count this process in "ib:<seq>:<what>"; *count: the count with it. */
int ib_kv_count_in(unsigned seq, const char *what, long *count);
/* The count of "ib:<seq>:members" now. */
int ib_kv_members(unsigned seq, long *count);
/* Wait until "ib:<seq>:<what>" reaches n: 0, or ETIMEDOUT. */
int ib_kv_await(unsigned seq, const char *what, long n, int seconds);

/* The first claim of key wins: 0 if ours, EEXIST if another's, or errno. */
int ib_kv_claim(const char *key, const char *value);

/* The value of key, or ENOENT. */
int ib_kv_get(const char *key, char *value, size_t size);

#endif
