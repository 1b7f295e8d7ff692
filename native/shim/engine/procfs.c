/* A signal mask of a /proc status file, read without stdio (ckpt_proc.h
 * has the rest of /proc). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "shim.h"

/* A signal mask line of a status file ("SigPnd:", "ShdPnd:"), or 0. */
uint64_t shim_status_mask(const char *path, const char *field)
{
	char buf[4096], *line;
	ssize_t n = ckpt_read_file(path, buf, sizeof(buf) - 1);
	size_t len = strlen(field);

	if (n <= 0)
		return 0;
	buf[n] = '\0';
	for (line = strstr(buf, field); line && line != buf && line[-1] != '\n';
	     line = strstr(line + 1, field))
		;
	return line ? strtoull(line + len, NULL, 16) : 0;
}
