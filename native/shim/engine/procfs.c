/* Reading the small /proc files the checkpoint thread needs, without stdio. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
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

/* A signal mask line of a status file ("SigPnd:", "ShdPnd:"), or 0. */
uint64_t shim_status_mask(const char *path, const char *field)
{
	char buf[4096], *line;
	ssize_t n = shim_read_proc(path, buf, sizeof(buf) - 1);
	size_t len = strlen(field);

	if (n <= 0)
		return 0;
	buf[n] = '\0';
	for (line = strstr(buf, field); line && line != buf && line[-1] != '\n';
	     line = strstr(line + 1, field))
		;
	return line ? strtoull(line + len, NULL, 16) : 0;
}
