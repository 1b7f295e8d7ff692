/*
 * The checkpoint thread's connection to the coordinator: one Unix stream
 * socket, one text line per message (docs/PROTOCOL.md).  Only the
 * checkpoint thread uses it, so it needs no lock.
 *
 * Two kinds of lines come in: PHASE lines, which the coordinator sends
 * when it decides (RESUME abort goes to every process as soon as one
 * fails, even to one still busy with the failed phase), and the answers
 * to our name-service requests, in order.  So the line after a request
 * need not be its answer: a PHASE line that comes first is kept for the
 * session loop, never taken for the answer (which lost RESUME abort when
 * it came during WRITE's file claims: the application stayed parked, its
 * TCP peer's give-back timed out and the next SUSPEND found it parked).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>
#include "shim.h"

/* PHASE lines kept while an answer was awaited: more than one only if the
 * coordinator moved on twice meanwhile (an abort, then the next checkpoint) */
#define DEFERRED_MAX 4

static int sock = -1;
static char inbuf[CKPT_LINE_MAX];
static size_t inlen;
static char deferred[DEFERRED_MAX][CKPT_LINE_MAX];
static unsigned ndeferred;

int coord_connect(const char *path)
{
	struct sockaddr_un addr;
	int fd;

	if (strlen(path) >= sizeof(addr.sun_path))
		return ENAMETOOLONG;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return errno;
	memset(&addr, 0, sizeof(addr));
	addr.sun_family = AF_UNIX;
	strcpy(addr.sun_path, path);
	/* the raw call: the shim's connect() resolves the real one with
	 * dlsym, whose loader lock this thread must never take (it passes
	 * for the main thread, whose TLS it copies: checkpointer.c) */
	if (syscall(SYS_connect, fd, (struct sockaddr *)&addr, sizeof(addr))) {
		int err = errno;

		close(fd);
		return err;
	}
	sock = fd;
	inlen = 0;
	ndeferred = 0;
	return 0;
}

void coord_close(void)
{
	if (sock >= 0) {
		close(sock);
	}
	sock = -1;
	inlen = 0;
	ndeferred = 0;
}

int coord_fd(void)
{
	return sock;
}

int coord_send(const char *fmt, ...)
{
	char line[CKPT_LINE_MAX];
	va_list ap;
	size_t off = 0;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	if (n < 0 || n >= (int)sizeof(line) - 1)
		return EMSGSIZE;
	line[n++] = '\n';
	while (off < (size_t)n) {
		ssize_t w = send(sock, line + off, n - off, MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return errno;
		off += w;
	}
	return 0;
}

/* The next line from the socket: 0, or -1 on EOF, error or a line too long. */
static int read_line(char *line, size_t size)
{
	for (;;) {
		char *nl = memchr(inbuf, '\n', inlen);
		ssize_t r;

		if (nl) {
			size_t len = nl - inbuf;

			if (len >= size)
				len = size - 1;
			memcpy(line, inbuf, len);
			line[len] = '\0';
			inlen -= nl + 1 - inbuf;
			memmove(inbuf, nl + 1, inlen);
			return 0;
		}
		if (inlen == sizeof(inbuf))
			return -1;	/* line too long: protocol error */
		r = read(sock, inbuf + inlen, sizeof(inbuf) - inlen);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		inlen += r;
	}
}

static int is_phase_line(const char *line)
{
	return !strncmp(line, "PHASE ", 6);
}

/* The session's next line: a PHASE line kept aside first, in order. */
int coord_recv(char *line, size_t size)
{
	if (!ndeferred)
		return read_line(line, size);
	snprintf(line, size, "%s", deferred[0]);
	ndeferred--;
	memmove(deferred[0], deferred[1], ndeferred * sizeof(deferred[0]));
	return 0;
}

/*
 * The answer to the name-service request just sent: the next line that is
 * not a PHASE line.  PHASE lines before it are kept for coord_recv, since
 * the checkpoint thread finishes its phase before it takes the next one.
 * -1 on EOF or error, or when more PHASE lines come than can be kept (a
 * coordinator that behaves so is not one we can follow).
 */
static int coord_recv_answer(char *line, size_t size)
{
	for (;;) {
		if (ndeferred == DEFERRED_MAX)
			return -1;
		if (read_line(deferred[ndeferred], sizeof(deferred[0])))
			return -1;
		if (!is_phase_line(deferred[ndeferred])) {
			snprintf(line, size, "%s", deferred[ndeferred]);
			return 0;
		}
		ndeferred++;
	}
}

/* kv_request_fn over the checkpoint connection: the request, then the
 * answer (PHASE lines that come first are kept for coord_recv). */
static int coord_request(void *conn, const char *request, char *answer, size_t size)
{
	int err = coord_send("%s", request);

	if (err)
		return err;
	return coord_recv_answer(answer, size) ? EPIPE : 0;
}

static const struct kv_client coord_client = { coord_request, NULL };

const struct kv_client *coord_kv(void)
{
	return &coord_client;
}

void coord_forget(void)
{
	sock = -1;
	inlen = 0;
	ndeferred = 0;
}
