/*
 * The checkpoint thread's connection to the coordinator: one Unix stream
 * socket, one text line per message (docs/PROTOCOL.md).  Only the
 * checkpoint thread uses it, so it needs no lock.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include "shim.h"

static int sock = -1;
static char inbuf[CKPT_LINE_MAX];
static size_t inlen;

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
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr))) {
		int err = errno;

		close(fd);
		return err;
	}
	sock = fd;
	inlen = 0;
	return 0;
}

void coord_close(void)
{
	if (sock >= 0) {
		close(sock);
	}
	sock = -1;
	inlen = 0;
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

int coord_recv(char *line, size_t size)
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

void coord_forget(void)
{
	sock = -1;
	inlen = 0;
}
