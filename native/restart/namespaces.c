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
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "restart.h"

static void write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);

	if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
		die("cannot write %s: %s", path, strerror(errno));
	close(fd);
}

/* An unprivileged restart's user namespace maps the user's own ids alone
 * and may not set groups: the job keeps the user's, as they were. */
static int setgroups_denied;

int namespace_denies_setgroups(void)
{
	return setgroups_denied;
}

void enter_namespaces(void)
{
	uid_t uid = geteuid();
	gid_t gid = getegid();
	/* an IPC namespace of its own: System V segments get their ids back */
	int flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC;
	char map[64];

	if (uid != 0)
		flags |= CLONE_NEWUSER;
	if (unshare(flags))
		die("cannot create the restart namespaces: %s", strerror(errno));
	if (uid == 0)
		return;
	write_file("/proc/self/setgroups", "deny");
	setgroups_denied = 1;
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

static pid_t init_pid;

static void forward_signal(int sig)
{
	if (init_pid > 0)
		kill(init_pid, sig);	/* pid 1 passes it to the root process */
}

static int exit_status(int status)
{
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return 128 + WTERMSIG(status);
}

/* The page server of --lazy ended before the last page was in (it said
 * why, unless killed): the job ends, none of its processes left waiting. */
static void page_server_lost(pid_t init, int status)
{
	if (WIFSIGNALED(status))
		warn("--lazy: the page server was killed (signal %d) before every page was in: "
		     "the job ends", WTERMSIG(status));
	kill(init, SIGKILL);
	while (waitpid(init, &status, 0) < 0 && errno == EINTR)
		;
	exit(EXIT_RESTORE_FAILED);
}

/* Forks pid 1 of the new pid namespace, which mounts its /proc and runs
 * init_main; we wait for it and pass on its status. */
int run_init(int (*init_main)(void))
{
	int status;
	pid_t init = fork();

	if (init < 0)
		die("cannot fork: %s", strerror(errno));
	if (init == 0) {
		/* the namespace ends with us: a ckpt-restart killed half way
		 * leaves no partly restored process running */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		mount_proc();
		_exit(init_main());
	}
	init_pid = init;
	lazy_close_requests();	/* the server sees when no process is left to send */
	shared_close_pipes();	/* the job's now, in the namespace */
	shared_close_shms();
	signal(SIGINT, forward_signal);
	signal(SIGTERM, forward_signal);
	signal(SIGHUP, forward_signal);
	for (;;) {
		pid_t got = waitpid(-1, &status, 0);

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			die("lost the restart namespace: %s", strerror(errno));
		if (got == init) {
			lazy_server_wait();	/* its last word on the status fd */
			return exit_status(status);
		}
		if (got == lazy_server_pid()) {
			lazy_server_forget();
			if (status)
				page_server_lost(init, status);
		}
	}
}
