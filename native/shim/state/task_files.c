/*
 * Files of threads (/proc/<pid>/task/<tid>/...) that the restart cannot
 * give back: a thread that has exited leaves its fds reading ESRCH, a file
 * of a task that is gone, which no restart can open again.  Refused when
 * the checkpoint starts, in one line (pair of the restart's reopening of
 * the files of live threads, restore_task_fds, restart/state/fds.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "shim.h"

#define MAX_LISTED 4096

int task_files_unsupported(char *why, size_t why_size)
{
	int fds[MAX_LISTED], n = app_list_fds(fds, MAX_LISTED);

	for (int i = 0; i < n; i++) {
		char link[64], path[256], task[64];
		ssize_t len;
		long pid, tid;

		snprintf(link, sizeof(link), "/proc/self/fd/%d", fds[i]);
		len = readlink(link, path, sizeof(path) - 1);
		if (len <= 0)
			continue;
		path[len] = '\0';
		if (!ckpt_task_path(path, &pid, &tid))
			continue;
		snprintf(task, sizeof(task), "/proc/%ld/task/%ld", pid, tid);
		if (access(task, F_OK) == 0 || errno != ENOENT)
			continue;
		snprintf(why, why_size, "fd %d (%s) is a file of thread %ld of process %ld, which "
			 "has exited: a restart cannot open it again", fds[i], path, tid, pid);
		return ENOTSUP;
	}
	return 0;
}
