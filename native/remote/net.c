/* Byte moving for ckpt-remote: timed reads, one relay step (whole writes:
 * ckpt_write_all, include/ckpt_io.h). */
#include <errno.h>
#include <poll.h>
#include <unistd.h>
#include "remote.h"

/* Reads exactly len bytes; -1 on error, end of file or timeout (ms, -1: none). */
int net_read_all(int fd, void *buf, size_t len, int timeout_ms)
{
	char *p = buf;

	while (len) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		ssize_t n;
		int r = poll(&pfd, 1, timeout_ms);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		n = read(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= n;
	}
	return 0;
}

/* Moves what one read of from gives to to: 1 moved, 0 end of file, -1 error
 * (of either side: the caller stops relaying this direction). */
int net_relay(int from, int to)
{
	char buf[65536];
	ssize_t n;

	do
		n = read(from, buf, sizeof(buf));
	while (n < 0 && errno == EINTR);
	if (n <= 0)
		return n == 0 ? 0 : -1;
	return ckpt_write_all(to, buf, n) ? -1 : 1;
}
