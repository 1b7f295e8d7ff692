/* Reading the small /proc files the checkpoint thread needs, without stdio. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include "shim.h"

/* Up to size bytes of path into buf (not terminated); length or -errno. */
ssize_t shim_read_proc(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	size_t len = 0;
	ssize_t n;

	if (fd < 0)
		return -errno;
	while (len < size && (n = read(fd, buf + len, size - len)) > 0)
		len += n;
	close(fd);
	return len;
}
