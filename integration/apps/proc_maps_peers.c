/*
 * Issue 37, shape 7: /proc files of other processes of the job held open,
 * as profilers and supervisors hold them: two sibling children each hold
 * the other's /proc/<pid>/maps (one of them is always restored before the
 * other exists), the parent holds the first child's maps and the second
 * child's /proc/<pid>/status.  Each process maps a memfd named after
 * itself.  At the end every file still describes the same process: its
 * maps list that process's memfd, the status its pid.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include "zdtm.h"

static void map_named(const char *name)
{
	int fd = memfd_create(name, MFD_CLOEXEC);

	zdtm_check(fd >= 0 && ftruncate(fd, 4096) == 0, "memfd %s: %m", name);
	zdtm_check(mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0) != MAP_FAILED, "mmap: %m");
	close(fd);
}

static int open_proc(pid_t pid, const char *file)
{
	char path[64];
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/%s", pid, file);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	zdtm_check(fd >= 0, "open %s: %m", path);
	return fd;
}

/* Whether the whole file, read from its start through fd, has what. */
static int file_has(int fd, const char *what)
{
	static char buf[1 << 16];
	size_t have = 0;
	ssize_t n;

	while ((n = pread(fd, buf + have, sizeof(buf) - 1 - have, have)) > 0)
		have += n;
	buf[have] = '\0';
	return strstr(buf, what) != NULL;
}

/* A child: maps its memfd, learns its sibling's pid, holds its maps. */
static int sibling(const char *me, const char *other_name, int pid_in, int ready)
{
	pid_t other;
	int maps, verdict;

	map_named(me);
	if (write(ready, "m", 1) != 1 || read(pid_in, &other, sizeof(other)) != sizeof(other))
		return 2;
	maps = open_proc(other, "maps");
	if (write(ready, "o", 1) != 1)
		return 3;
	zdtm_hold();
	verdict = file_has(maps, other_name) ? 0 : 4;
	/* alive until the parent read our files: it closes the pipe */
	while (read(pid_in, &other, sizeof(other)) > 0)
		;
	return verdict;
}

/* not_mine: the earlier sibling's pipe end, which would keep it waiting */
static pid_t spawn(const char *me, const char *other, int pid_in[2], int ready[2], int not_mine)
{
	pid_t pid = fork();

	zdtm_check(pid >= 0, "fork: %m");
	if (pid == 0) {
		close(pid_in[1]);
		close(ready[0]);
		if (not_mine >= 0)
			close(not_mine);
		_exit(sibling(me, other, pid_in[0], ready[1]));
	}
	close(pid_in[0]);
	return pid;
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	int to_a[2], to_b[2], ready[2], maps_a, status_b, status;
	pid_t a, b;
	char byte;
	uint64_t hash;

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(pipe(to_a) == 0 && pipe(to_b) == 0 && pipe(ready) == 0, "pipe: %m");
	a = spawn("peer-a", "/memfd:peer-b", to_a, ready, -1);
	b = spawn("peer-b", "/memfd:peer-a", to_b, ready, to_a[1]);
	close(ready[1]);
	/* both mapped their memfd, then each opens its sibling's maps */
	zdtm_check(read(ready[0], &byte, 1) == 1 && read(ready[0], &byte, 1) == 1,
		   "the children did not map their memfds");
	zdtm_check(write(to_a[1], &b, sizeof(b)) == sizeof(b) &&
		   write(to_b[1], &a, sizeof(a)) == sizeof(a), "write: %m");
	zdtm_check(read(ready[0], &byte, 1) == 1 && read(ready[0], &byte, 1) == 1,
		   "the children did not open their sibling's maps");
	maps_a = open_proc(a, "maps");
	status_b = open_proc(b, "status");
	printf("READY\n");
	fflush(stdout);
	hash = zdtm_steps_hash(0, steps, pace);
	zdtm_hold();
	zdtm_check(file_has(maps_a, "/memfd:peer-a"), "the first child's maps are not its own");
	{
		char line[32];

		snprintf(line, sizeof(line), "\nPid:\t%d\n", b);
		zdtm_check(file_has(status_b, line), "the second child's status is not its own");
	}
	close(to_a[1]);
	close(to_b[1]);
	zdtm_check(waitpid(a, &status, 0) == a && WIFEXITED(status) && !WEXITSTATUS(status),
		   "the first child's check failed (%#x)", status);
	zdtm_check(waitpid(b, &status, 0) == b && WIFEXITED(status) && !WEXITSTATUS(status),
		   "the second child's check failed (%#x)", status);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
