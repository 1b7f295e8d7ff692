/*
 * seccomp: a thread in strict mode may only read, write, exit and
 * sigreturn, and a filter may forbid what the parking handler calls; the
 * kernel would kill such a thread as soon as it parked.  Such processes
 * are refused at SUSPEND, with the thread and its mode named, before any
 * thread is signalled: the checkpoint fails cleanly and the job goes on.
 *
 * The shim notes when the application turns seccomp on (prctl
 * PR_SET_SECCOMP, or the seccomp system call through syscall(), as
 * libseccomp does) or inherited filters across exec, so that only those
 * processes pay for looking at every thread's /proc status at SUSPEND.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include "shim.h"

static atomic_int seccomp_used;

void seccomp_note_call(long nr)
{
	if (nr == SYS_seccomp)
		atomic_store(&seccomp_used, 1);
}

typedef int (*prctl_fn)(int, unsigned long, unsigned long, unsigned long, unsigned long);

SHIM_EXPORT int prctl(int option, ...)
{
	static void *real;
	unsigned long a[4];
	va_list ap;

	va_start(ap, option);
	for (int i = 0; i < 4; i++)
		a[i] = va_arg(ap, unsigned long);
	va_end(ap);
	if (option == PR_SET_SECCOMP)
		atomic_store(&seccomp_used, 1);
	if (!real)
		real = dlsym(RTLD_NEXT, "prctl");
	return ((prctl_fn)real)(option, a[0], a[1], a[2], a[3]);
}

/* "Seccomp:" and "Seccomp_filters:" of one thread's status. */
static int thread_seccomp(const char *tid, int *mode, int *filters)
{
	char path[64], buf[4096], *p;
	ssize_t n;

	if (!strcmp(tid, "self") || !strcmp(tid, "thread-self"))
		snprintf(path, sizeof(path), "/proc/%s/status", tid);
	else
		snprintf(path, sizeof(path), "/proc/self/task/%s/status", tid);
	n = ckpt_read_file(path, buf, sizeof(buf) - 1);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	p = strstr(buf, "\nSeccomp:");
	*mode = p ? atoi(p + 9) : 0;
	p = strstr(buf, "\nSeccomp_filters:");
	*filters = p ? atoi(p + 17) : 0;
	return 0;
}

/* Whether the calling thread runs under seccomp: helpers it would start
 * (compress.c) might meet a filter that kills on clone3. */
int seccomp_here(void)
{
	int mode, filters;

	return thread_seccomp("thread-self", &mode, &filters) != 0 || mode != 0;
}

/* Filters survive exec: a program may start with them. */
void seccomp_init(void)
{
	int mode, filters;

	if (thread_seccomp("self", &mode, &filters) == 0 && mode)
		atomic_store(&seccomp_used, 1);
}

struct seccomp_why {
	char *why;
	size_t size;
};

/* ENOTSUP, with why, if thread name is in seccomp mode. */
static int thread_in_seccomp(int dfd, const char *name, uint64_t ino, void *arg)
{
	struct seccomp_why *w = arg;
	int mode, filters;

	if (name[0] < '1' || name[0] > '9' || thread_seccomp(name, &mode, &filters) || mode == 0)
		return 0;
	if (mode == 1)
		snprintf(w->why, w->size, "thread %s of process %d is in seccomp strict "
			 "mode: it cannot be parked; not supported yet", name, getpid());
	else
		snprintf(w->why, w->size, "thread %s of process %d has %d seccomp "
			 "filter(s): parking it could be forbidden; not supported "
			 "yet", name, getpid(), filters);
	return ENOTSUP;
}

/* 0, or ENOTSUP with why naming the first thread in seccomp mode. */
int seccomp_check_threads(char *why, size_t size)
{
	struct seccomp_why w = { why, size };

	if (!atomic_load(&seccomp_used))
		return 0;
	return ckpt_dir_walk("/proc/self/task", thread_in_seccomp, &w) == ENOTSUP ? ENOTSUP : 0;
}
