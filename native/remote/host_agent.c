/*
 * Joining the job on this host, before ckpt-remote's server runs with the
 * shim.  The job's processes reach the job through the Unix socket that
 * $CKPT_COORD names, a host-local path: on the coordinator's host the
 * coordinator serves it, on any other host the job's agent (`ckpt agent`,
 * ckpt/agent.py), which speaks to the coordinator over authenticated TCP.
 * The first ckpt-remote of the job on a host starts that agent, under a
 * lock next to the socket, and waits until it serves the socket.  Only then
 * does the server load the shim (ssh brought it as $CKPT_PRELOAD), so that
 * its checkpoint thread finds the job at once.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "remote.h"

#define AGENT_START_SECONDS 30

static int socket_answers(const char *path)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	int fd, ok;

	if (strlen(path) >= sizeof(addr.sun_path))
		die("socket path too long: %s", path);
	strcpy(addr.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		die("socket: %s", strerror(errno));
	ok = !connect(fd, (struct sockaddr *)&addr, sizeof(addr));
	close(fd);
	return ok;
}

/* mkdir -p of path's directory, each new level 0700 (the socket's
 * directory is private, as the launcher's is). */
static void make_parent_dirs(const char *path)
{
	char dir[PATH_MAX];

	snprintf(dir, sizeof(dir), "%s", path);
	for (char *p = dir + 1; (p = strchr(p, '/')); p++) {
		*p = 0;
		if (mkdir(dir, 0700) && errno != EEXIST)
			die("cannot create %s: %s", dir, strerror(errno));
		*p = '/';
	}
}

/* The agent's messages: agent-<host>.log next to the job's secret. */
static int open_log(const char *secret_file)
{
	char path[PATH_MAX], host[256] = "host";
	const char *slash = strrchr(secret_file, '/');
	int len = slash ? (int)(slash - secret_file) : 1;

	gethostname(host, sizeof(host) - 1);
	snprintf(path, sizeof(path), "%.*s/agent-%s.log", len, slash ? secret_file : ".", host);
	return open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
}

/* `CKPT_AGENT agent`, detached from the ssh session (its own session, no
 * fd of the session kept open, or sshd would wait for it). */
static void spawn_agent(const char *program, const char *secret_file)
{
	pid_t pid = fork();
	int status;

	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		int log = open_log(secret_file), null = open("/dev/null", O_RDONLY);

		setsid();
		if (fork() != 0)
			_exit(0);
		dup2(null, 0);
		dup2(log >= 0 ? log : null, 1);
		dup2(log >= 0 ? log : null, 2);
		close_range(3, ~0U, 0);
		execl(program, program, "agent", (char *)NULL);
		fprintf(stderr, "ckpt-remote: cannot run %s: %s\n", program, strerror(errno));
		_exit(127);
	}
	waitpid(pid, &status, 0);
}

static void wait_for_agent(const char *coord, const char *secret_file)
{
	struct timespec pause = { 0, 20 * 1000 * 1000 };
	time_t deadline = time(NULL) + AGENT_START_SECONDS;

	while (!socket_answers(coord)) {
		if (time(NULL) > deadline)
			die("the job's agent did not start on this host within %d s (see agent-*.log "
			    "next to %s)", AGENT_START_SECONDS, secret_file);
		nanosleep(&pause, NULL);
	}
}

static void ensure_agent(const char *coord)
{
	const char *program = getenv("CKPT_AGENT"), *secret_file = getenv("CKPT_SECRET_FILE");
	char lock_path[PATH_MAX];
	int lock;

	if (!program || !secret_file || !getenv("CKPT_COORD_TCP"))
		die("the job's variables lack CKPT_AGENT, CKPT_SECRET_FILE or CKPT_COORD_TCP");
	make_parent_dirs(coord);
	snprintf(lock_path, sizeof(lock_path), "%s.lock", coord);
	lock = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (lock < 0 || flock(lock, LOCK_EX))
		die("cannot lock %s: %s", lock_path, strerror(errno));
	if (!socket_answers(coord)) {	/* not another ckpt-remote's agent already */
		spawn_agent(program, secret_file);
		wait_for_agent(coord, secret_file);
	}
	close(lock);
}

void host_join_job(char **argv)
{
	const char *coord = getenv("CKPT_COORD"), *preload = getenv("CKPT_PRELOAD");

	if (!preload)
		return;		/* the shim is loaded: joined already */
	if (coord && !socket_answers(coord))
		ensure_agent(coord);
	if (setenv("LD_PRELOAD", preload, 1) || unsetenv("CKPT_PRELOAD"))
		die("setenv: %s", strerror(errno));
	execv("/proc/self/exe", argv);
	die("cannot run itself again: %s", strerror(errno));
}
