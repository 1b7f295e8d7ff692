/*
 * Writing a whole buffer to an fd, for the shim and ckpt-restart alike
 * (before the restart's point of no return: it goes through libc).
 */
#ifndef CKPT_IO_H
#define CKPT_IO_H

#include <errno.h>
#include <stddef.h>
#include <unistd.h>

/* 0, or the errno of the write that failed (EIO: one that wrote nothing). */
static inline int ckpt_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n ? errno : EIO;
		p += n;
		len -= n;
	}
	return 0;
}

#endif
