/*
 * /proc without libc state: a getdents64 directory walker and a stat
 * reader.  Used by the shim's checkpoint thread while the application's
 * threads may hold malloc and stdio locks, by ckpt-restart, by the IB
 * plugin and by softverbs; numbers are parsed here, not by strtoul (locale).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "ckpt_proc.h"

#define DIR_BUF 4096
#define STAT_BUF 2048

struct linux_dirent64 {
	uint64_t ino;
	int64_t off;
	unsigned short reclen;
	unsigned char type;
	char name[];
};

ssize_t ckpt_read_file(const char *path, char *buf, size_t size)
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

static int dot_or_dotdot(const char *name)
{
	return name[0] == '.' && (!name[1] || (name[1] == '.' && !name[2]));
}

/* One getdents64 buffer's entries; fn's first nonzero return. */
static int walk_buffer(int dfd, const char *buf, long n, ckpt_dir_fn fn, void *arg)
{
	for (long off = 0; off < n;) {
		const struct linux_dirent64 *d = (const void *)(buf + off);
		int stop;

		off += d->reclen;
		if (dot_or_dotdot(d->name))
			continue;
		stop = fn(dfd, d->name, d->ino, arg);
		if (stop)
			return stop;
	}
	return 0;
}

int ckpt_dir_walk(const char *path, ckpt_dir_fn fn, void *arg)
{
	char buf[DIR_BUF] __attribute__((aligned(8)));
	int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int stop = 0;
	long n;

	if (dfd < 0)
		return -errno;
	while (!stop && (n = syscall(SYS_getdents64, dfd, buf, sizeof(buf))) > 0)
		stop = walk_buffer(dfd, buf, n, fn, arg);
	close(dfd);
	return stop;
}

/* A decimal field, perhaps negative; *p moves past it. */
static int64_t number(const char **p)
{
	const char *c = *p;
	int neg = *c == '-';
	uint64_t v = 0;

	c += neg;
	while (*c >= '0' && *c <= '9')
		v = v * 10 + (uint64_t)(*c++ - '0');
	*p = c;
	return neg ? -(int64_t)v : (int64_t)v;
}

static void store(struct ckpt_proc_stat *st, int field, const char *c)
{
	int64_t v;

	if (field == 3) {
		st->state = *c;
		return;
	}
	v = number(&c);
	switch (field) {
	case 4: st->ppid = (int)v; break;
	case 5: st->pgid = (int)v; break;
	case 6: st->session = (int)v; break;
	case 7: st->tty_nr = (unsigned)v; break;
	case 8: st->tpgid = (int)v; break;
	case 22: st->starttime = v; break;
	case 26: st->start_code = v; break;
	case 27: st->end_code = v; break;
	case 28: st->start_stack = v; break;
	case 45: st->start_data = v; break;
	case 46: st->end_data = v; break;
	case 47: st->start_brk = v; break;
	case 48: st->arg_start = v; break;
	case 49: st->arg_end = v; break;
	case 50: st->env_start = v; break;
	case 51: st->env_end = v; break;
	case 52: st->exit_code = (int)v; break;
	}
}

int ckpt_stat_parse(const char *line, struct ckpt_proc_stat *st)
{
	const char *c = strrchr(line, ')');	/* the command may hold ')' and spaces */
	int field = 2;

	memset(st, 0, sizeof(*st));
	if (!c)
		return EIO;
	for (c++; *c && *c != '\n';) {
		while (*c == ' ')
			c++;
		if (!*c || *c == '\n')
			break;
		store(st, ++field, c);
		while (*c && *c != ' ')
			c++;
	}
	st->last_field = field;
	return 0;
}

int ckpt_stat_read(const char *path, struct ckpt_proc_stat *st)
{
	char buf[STAT_BUF];
	ssize_t n = ckpt_read_file(path, buf, sizeof(buf) - 1);

	memset(st, 0, sizeof(*st));
	if (n <= 0)
		return n < 0 ? (int)n : EIO;
	buf[n] = '\0';
	return ckpt_stat_parse(buf, st);
}

/* "/proc/<pid>/stat" without snprintf */
int ckpt_stat_read_pid(pid_t pid, struct ckpt_proc_stat *st)
{
	char path[32] = "/proc/", digits[12];
	size_t len = strlen(path);
	int k = 0;

	do
		digits[k++] = '0' + pid % 10;
	while ((pid /= 10) && k < 11);
	while (k)
		path[len++] = digits[--k];
	memcpy(path + len, "/stat", 6);
	return ckpt_stat_read(path, st);
}

/* A decimal number of up to 9 digits at *p, moved past it; -1 if none. */
static long read_number(const char **p)
{
	long n = 0;
	int digits = 0;

	for (; **p >= '0' && **p <= '9' && digits < 9; (*p)++, digits++)
		n = n * 10 + (**p - '0');
	return digits && (**p < '0' || **p > '9') ? n : -1;
}

int ckpt_task_path(const char *path, long *pid, long *tid)
{
	const char *p = path;

	if (strncmp(p, "/proc/", 6))
		return 0;
	p += 6;
	*pid = read_number(&p);
	if (*pid <= 0 || strncmp(p, "/task/", 6))
		return 0;
	p += 6;
	*tid = read_number(&p);
	return *tid > 0 && (*p == '/' || *p == '\0');
}
