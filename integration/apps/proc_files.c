/*
 * Files under /proc of the job's own processes held open, as monitoring
 * threads and supervisors hold them: a parent holds its child's
 * /proc/<pid>/status and its /proc/<pid> directory, the child holds its
 * parent's /proc/<pid>/stat and its own /proc/self/fd directory.  After a
 * restart each still describes the same process (its pid restored).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include "zdtm.h"

/* The "Pid:" line of a status file read from the start, through fd. */
static long status_pid(int fd)
{
	char buf[4096];
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
	const char *line;

	if (n <= 0)
		return -1;
	buf[n] = '\0';
	line = strstr(buf, "\nPid:");
	return line ? atol(line + 5) : -1;
}

static long stat_pid(int fd)
{
	char buf[512];
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

	if (n <= 0)
		return -1;
	buf[n] = '\0';
	return atol(buf);
}

static int child_main(pid_t parent, long steps, long pace)
{
	char path[64];
	int stat_fd, fds_dir, n = 0;
	struct dirent *d;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/stat", parent);
	stat_fd = open(path, O_RDONLY);
	fds_dir = open("/proc/self/fd", O_RDONLY | O_DIRECTORY);
	if (stat_fd < 0 || fds_dir < 0)
		return 2;
	zdtm_steps_hash(0, steps, pace);
	if (stat_pid(stat_fd) != parent)
		return 3;	/* no longer the parent's */
	dir = fdopendir(fds_dir);
	if (!dir)
		return 4;
	while ((d = readdir(dir)))
		n += d->d_name[0] != '.' && atoi(d->d_name) == stat_fd;
	return n == 1 ? 0 : 5;	/* the directory lists this process's fds */
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	char path[64];
	int status_fd, dir_fd, comm_fd, status;
	pid_t child;
	uint64_t hash;

	zdtm_args(argc, argv, &steps, &pace);
	child = fork();
	zdtm_check(child >= 0, "fork");
	if (!child)
		_exit(child_main(getppid(), steps, pace));
	snprintf(path, sizeof(path), "/proc/%d/status", child);
	status_fd = open(path, O_RDONLY);
	snprintf(path, sizeof(path), "/proc/%d", child);
	dir_fd = open(path, O_RDONLY | O_DIRECTORY);
	zdtm_check(status_fd >= 0 && dir_fd >= 0, "opening the child's /proc files: %s",
		   strerror(errno));
	printf("READY\n");
	fflush(stdout);
	hash = zdtm_steps_hash(0, steps, pace);
	zdtm_hold();
	zdtm_check(status_pid(status_fd) == child, "the child's status says pid %ld, not %d",
		   status_pid(status_fd), child);
	comm_fd = openat(dir_fd, "status", O_RDONLY);
	zdtm_check(comm_fd >= 0 && status_pid(comm_fd) == child,
		   "the child's /proc directory: %s", strerror(errno));
	zdtm_check(waitpid(child, &status, 0) == child && WIFEXITED(status) &&
		   WEXITSTATUS(status) == 0, "the child's check %d failed", WEXITSTATUS(status));
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
