/* Diagnostics of the shim: formatted on the stack, written with write(2),
 * because the application's threads may hold stdio and malloc locks. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>
#include "shim.h"

/* The checkpoint thread's own fd 2 is /dev/null: it writes through a
 * copy of the application's fd 2, so a file's offset moves on as if the
 * application wrote the line (a file opened again through /proc has an
 * offset of its own: the application's next write would cover the line). */
static void write_stderr(const char *line, size_t n)
{
	int fd = STDERR_FILENO;

	if (checkpointer_is_current()) {
		fd = app_getfd(STDERR_FILENO);
		if (fd < 0)	/* no pidfd_getfd: at the end of the file */
			fd = open("/proc/self/fd/2", O_WRONLY | O_APPEND | O_NOCTTY | O_CLOEXEC);
	}
	if (fd < 0)
		return;
	if (write(fd, line, n) < 0)
		n = 0;
	if (fd != STDERR_FILENO)
		close(fd);
}

void shim_log(const char *fmt, ...)
{
	char line[512];
	va_list ap;
	int n;

	n = snprintf(line, sizeof(line), "ckpt[%d]: ", getpid());
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	write_stderr(line, n);
}

int64_t shim_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static struct utsname host_uts;

const char *shim_hostname(void)
{
	if (!host_uts.nodename[0] && uname(&host_uts))
		strcpy(host_uts.nodename, "localhost");
	return host_uts.nodename;
}

/* After a restart, perhaps on another host: ask again. */
void shim_hostname_forget(void)
{
	host_uts.nodename[0] = 0;
}

/* strerror() may malloc and take locale locks (translations, unknown
 * errnos), and glibc believes the process single-threaded: the checkpoint
 * thread uses the untranslated, static descriptions instead. */
const char *shim_strerror(int err)
{
	const char *desc = strerrordesc_np(err);

	return desc ? desc : "unknown error";
}
