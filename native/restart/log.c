/* Error reporting: one line on stderr.  After the fds are restored the
 * restarter's stderr lives on at a high fd (set_error_fd). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "restart.h"
#include "sys.h"
#include <sys/syscall.h>

static int error_fd = 2;
static void (*on_failure)(int status);

/* A restored process of a tree tells pid 1 and brings the restart down. */
void set_failure_hook(void (*hook)(int status))
{
	on_failure = hook;
}

int get_error_fd(void)
{
	return error_fd;
}

void set_error_fd(int fd)
{
	error_fd = fd;
}

/* One line, whatever a path from an image holds: control bytes become '?'. */
static void one_line(char *s, int n)
{
	for (int i = 0; i < n; i++)
		if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
			s[i] = '?';
}

void die(const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	int n = snprintf(line, sizeof(line), "ckpt-restart: ");

	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = sizeof(line) - 2;
	one_line(line, n);
	line[n++] = '\n';
	sys3(SYS_write, error_fd, line, n);
	if (on_failure)
		on_failure(EXIT_RESTART_FAILED);
	sys1(SYS_exit_group, EXIT_RESTART_FAILED);
	__builtin_unreachable();
}

void warn(const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	int n = snprintf(line, sizeof(line), "ckpt-restart: warning: ");

	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = sizeof(line) - 2;
	one_line(line, n);
	line[n++] = '\n';
	sys3(SYS_write, error_fd, line, n);
}

/* After the point of no return: no formatting library, the process is lost. */
void fatal(const char *what, long err)
{
	char line[256];
	size_t n = 0;
	const char *prefix = "ckpt-restart: restore failed: ";
	char num[24];
	int k = 0;
	unsigned long e = err < 0 ? -err : err;

	for (const char *p = prefix; *p && n < sizeof(line); p++)
		line[n++] = *p;
	for (const char *p = what; *p && n < sizeof(line) - 30; p++)
		line[n++] = *p;
	do
		num[k++] = '0' + e % 10;
	while ((e /= 10) && k < 20);
	line[n++] = ' ';
	line[n++] = '(';
	line[n++] = 'e';
	while (k)
		line[n++] = num[--k];
	line[n++] = ')';
	line[n++] = '\n';
	sys3(SYS_write, error_fd, line, n);
	if (on_failure)
		on_failure(EXIT_RESTORE_FAILED);
	sys1(SYS_exit_group, EXIT_RESTORE_FAILED);
	__builtin_unreachable();
}
