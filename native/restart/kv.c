/*
 * The coordinator's name service, for ckpt-restart itself: the ckpt-restarts
 * of a job's hosts meet there to connect the job's TCP connections that
 * cross hosts (cross_host.c).  A `KV` connection to the job's socket on this
 * host (the coordinator's, or the agent's that forwards it); one request,
 * one answer line (docs/PROTOCOL.md).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "ckpt_kv.h"
#include "restart.h"

#define KV_CONNECT_WAIT_MS 30000

static int kv_fd = -1;

/*
 * On another host, ckpt-restart starts beside its agent (the agent's
 * parent shell forks it first: ckpt/restart.py), so the agent's socket may
 * not be there yet: wait for it while the agent, our parent, lives.
 */
static int connect_when_listening(const char *coord)
{
	struct timespec pause = { 0, 5 * 1000 * 1000 };
	pid_t agent = getppid();

	for (unsigned waited_ms = 0;; waited_ms += 5) {
		int fd = kv_connect(coord);

		if (fd >= 0 || (fd != -ENOENT && fd != -ECONNREFUSED) || getppid() != agent ||
		    waited_ms >= KV_CONNECT_WAIT_MS)
			return fd;
		nanosleep(&pause, NULL);
	}
}

void kv_open(const char *coord)
{
	int fd;

	if (kv_fd >= 0)
		return;
	fd = connect_when_listening(coord);
	if (fd < 0)
		die("cannot reach the job's coordinator at %s: %s", coord, strerror(-fd));
	kv_fd = move_high(fd, "the coordinator connection");
}

void kv_close(void)
{
	if (kv_fd >= 0)
		close(kv_fd);
	kv_fd = -1;
}

static const struct kv_client *client(void)
{
	static struct kv_client kv = { kv_fd_request, &kv_fd };

	return &kv;
}

void kv_put(const char *key, const char *value)
{
	int err = kv_client_put(client(), key, value);

	if (err == EPROTO)
		die("the coordinator refused %s", key);
	if (err)
		die("the coordinator's name service failed (%s): %s", key, strerror(err));
}

/* The value of key once some process of the job put it; dies after
 * `seconds`, naming what it waited for. */
void kv_wait(const char *key, unsigned seconds, char *value, size_t size)
{
	int err = kv_client_mwait(client(), (int)seconds, key, value, size);

	if (err == ETIMEDOUT)
		die("no other host of the job answered for %s within %u s (is its ckpt-restart "
		    "running?)", key, seconds);
	if (err)
		die("the coordinator's name service failed (%s): %s", key, strerror(err));
}
