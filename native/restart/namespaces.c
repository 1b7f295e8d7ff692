/*
 * A fresh user (when not root), pid and mount namespace per restart, with
 * its own /proc: the restored process gets its original pid and tids with
 * clone3's set_tid, so getpid(), glibc's cached tids and /proc/<pid> need
 * no wrapping.  No execve happens after unshare: the capabilities we hold
 * in the new user namespace must survive.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "restart.h"

static pid_t restored_pid;

static void write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);

	if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
		die("cannot write %s: %s", path, strerror(errno));
	close(fd);
}

void enter_namespaces(void)
{
	uid_t uid = geteuid();
	gid_t gid = getegid();
	int flags = CLONE_NEWPID | CLONE_NEWNS;
	char map[64];

	if (uid != 0)
		flags |= CLONE_NEWUSER;
	if (unshare(flags))
		die("cannot create the restart namespaces: %s", strerror(errno));
	if (uid == 0)
		return;
	write_file("/proc/self/setgroups", "deny");
	snprintf(map, sizeof(map), "%u %u 1\n", uid, uid);
	write_file("/proc/self/uid_map", map);
	snprintf(map, sizeof(map), "%u %u 1\n", gid, gid);
	write_file("/proc/self/gid_map", map);
}

static void mount_proc(void)
{
	if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL))
		die("cannot make the mount namespace private: %s", strerror(errno));
	if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
		die("cannot mount a fresh /proc: %s", strerror(errno));
}

static void forward_signal(int sig)
{
	if (restored_pid > 0)
		kill(restored_pid, sig);
}

static int exit_status(int status)
{
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return 128 + WTERMSIG(status);
}

/* pid 1 of the namespace: creates the restored process with its pid, reaps
 * orphans, and exits with the restored process's status. */
static int init_main(struct image *img, int (*restorer)(void *), void *arg)
{
	pid_t pid = img->hdr.pid;
	struct clone_args ca;
	int status;

	mount_proc();
	if (pid <= 1)
		die("cannot restore pid %d", pid);
	memset(&ca, 0, sizeof(ca));
	ca.exit_signal = SIGCHLD;
	ca.stack = (uint64_t)zone_stack(0) - ZONE_STACK_SIZE;
	ca.stack_size = ZONE_STACK_SIZE;
	ca.set_tid = (uint64_t)&pid;
	ca.set_tid_size = 1;
	restored_pid = clone3_run(&ca, sizeof(ca), restorer, arg);
	if (restored_pid < 0)
		die("cannot create process %d (clone3 set_tid): %s", pid, strerror(-restored_pid));
	signal(SIGINT, forward_signal);
	signal(SIGTERM, forward_signal);
	signal(SIGHUP, forward_signal);
	for (;;) {
		pid_t got = waitpid(-1, &status, 0);

		if (got == restored_pid)
			return exit_status(status);
		if (got < 0 && errno != EINTR)
			return EXIT_RESTORE_FAILED;
	}
}

int run_init(struct image *img, int (*restorer)(void *), void *arg)
{
	int status;
	pid_t init = fork();

	if (init < 0)
		die("cannot fork: %s", strerror(errno));
	if (init == 0)
		_exit(init_main(img, restorer, arg));
	restored_pid = init;
	signal(SIGINT, forward_signal);
	signal(SIGTERM, forward_signal);
	signal(SIGHUP, forward_signal);
	while (waitpid(init, &status, 0) < 0)
		if (errno != EINTR)
			die("lost the restart namespace: %s", strerror(errno));
	return exit_status(status);
}
