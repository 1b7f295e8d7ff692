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
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include "restart.h"

#define KV_LINE_MAX 4096
#define KV_CONNECT_WAIT_MS 30000

static int kv_fd = -1;

/*
 * On another host, ckpt-restart starts beside its agent (the agent's
 * parent shell forks it first: ckpt/restart.py), so the agent's socket may
 * not be there yet: wait for it while the agent, our parent, lives.
 */
static int connect_when_listening(int fd, const struct sockaddr_un *addr)
{
	struct timespec pause = { 0, 5 * 1000 * 1000 };
	pid_t agent = getppid();

	for (unsigned waited_ms = 0;; waited_ms += 5) {
		if (!connect(fd, (const struct sockaddr *)addr, sizeof(*addr)))
			return 0;
		if ((errno != ENOENT && errno != ECONNREFUSED) || getppid() != agent ||
		    waited_ms >= KV_CONNECT_WAIT_MS)
			return -1;
		nanosleep(&pause, NULL);
	}
}

void kv_open(const char *coord)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };

	if (kv_fd >= 0)
		return;
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", coord);
	kv_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (kv_fd < 0 || connect_when_listening(kv_fd, &addr))
		die("cannot reach the job's coordinator at %s: %s", coord, strerror(errno));
	kv_fd = move_high(kv_fd, "the coordinator connection");
	write_all(kv_fd, "KV\n", 3, "the coordinator");
}

void kv_close(void)
{
	if (kv_fd >= 0)
		close(kv_fd);
	kv_fd = -1;
}

/* One request line, its answer into out (without the newline). */
static void kv_request(const char *request, char *out, size_t size)
{
	size_t len = 0;

	write_all(kv_fd, request, strlen(request), "the coordinator");
	for (;;) {
		ssize_t n;

		if (len + 1 >= size)
			die("the coordinator's answer is too long");
		n = read(kv_fd, out + len, 1);	/* byte by byte: a few short lines */
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("the coordinator closed the connection");
		if (out[len] == '\n')
			break;
		len++;
	}
	out[len] = 0;
}

void kv_put(const char *key, const char *value)
{
	char line[KV_LINE_MAX], answer[64];

	snprintf(line, sizeof(line), "PUT %s %s\n", key, value);
	kv_request(line, answer, sizeof(answer));
	if (strcmp(answer, "OK"))
		die("the coordinator refused %s: %s", key, answer);
}

/* The value of key once some process of the job put it; dies after
 * `seconds`, naming what it waited for. */
void kv_wait(const char *key, unsigned seconds, char *value, size_t size)
{
	char line[KV_LINE_MAX], answer[KV_LINE_MAX];

	snprintf(line, sizeof(line), "MWAIT %u %s\n", seconds, key);
	kv_request(line, answer, sizeof(answer));
	if (strncmp(answer, "VAL ", 4))
		die("no other host of the job answered for %s within %u s (is its ckpt-restart "
		    "running?)", key, seconds);
	snprintf(value, size, "%s", answer + 4);
}
