/*
 * The launching side of ckpt-remote, run in place of ssh, rsh or srun by a
 * process of the job (see remote.h).  It starts the servers through the
 * real program (one through ssh, one per task through srun), accepts each
 * server's four connections, then relays their stdio and ends with the
 * remote commands' exit status.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "remote.h"

#define CONNECT_BACK_SECONDS 60	/* after the real ssh/rsh ended well */
#define MAX_TASKS (1u << 20)

extern char **environ;

/* ---- the remote command line --------------------------------------- */

/* s in single quotes for a POSIX shell; a ' becomes '\'' */
static void append_quoted(char **buf, size_t *len, const char *s)
{
	size_t need = *len + 4 * strlen(s) + 4;
	char *p;

	*buf = realloc(*buf, need);
	if (!*buf)
		die("out of memory");
	p = *buf + *len;
	*p++ = '\'';
	for (; *s; s++) {
		if (*s == '\'') {
			memcpy(p, "'\\''", 4);
			p += 4;
		} else {
			*p++ = *s;
		}
	}
	*p++ = '\'';
	*p++ = ' ';
	*p = 0;
	*len = p - *buf;
}

static int is_job_variable(const char *entry)
{
	return !strncmp(entry, "LD_PRELOAD=", 11) || !strncmp(entry, "CKPT_", 5);
}

/* exec env CKPT_PRELOAD=... CKPT_...=... ckpt-remote --serve HOST:PORT 'COMMAND':
 * the server loads the shim itself once the job can be joined on its host
 * (host_agent.c) */
/* This program's path, for the remote side to run. */
static void own_program(char self[4096])
{
	ssize_t n = readlink("/proc/self/exe", self, 4095);

	if (n <= 0)
		die("cannot find its own program: %s", strerror(errno));
	self[n] = 0;
}

static char *server_command(const char *back, int argc, char **argv, int first)
{
	char self[4096], *buf = NULL, *words = NULL;
	size_t len = 0, words_len = 0;

	own_program(self);
	buf = strdup("exec env ");
	len = strlen(buf);
	for (char **e = environ; *e; e++) {
		if (!strncmp(*e, "LD_PRELOAD=", 11)) {
			char renamed[8192];

			snprintf(renamed, sizeof(renamed), "CKPT_PRELOAD=%s", *e + 11);
			append_quoted(&buf, &len, renamed);
		} else if (is_job_variable(*e)) {
			append_quoted(&buf, &len, *e);
		}
	}
	append_quoted(&buf, &len, self);
	append_quoted(&buf, &len, "--serve");
	append_quoted(&buf, &len, back);
	/* ssh joins the command's words with spaces for the remote shell */
	for (int i = first; i < argc; i++) {
		size_t w = strlen(argv[i]);

		words = realloc(words, words_len + w + 2);
		if (!words)
			die("out of memory");
		memcpy(words + words_len, argv[i], w);
		words_len += w;
		words[words_len++] = i + 1 < argc ? ' ' : 0;
	}
	append_quoted(&buf, &len, words);
	free(words);
	return buf;
}

/* ---- the real ssh/rsh, outside the job ------------------------------- */

static const char *find_program(const char *name, char *buf, size_t size)
{
	const char *path = getenv("PATH");

	if (strchr(name, '/'))
		return name;
	if (!path)
		path = "/usr/bin:/bin";
	while (*path) {
		size_t n = strcspn(path, ":");

		snprintf(buf, size, "%.*s/%s", (int)n, path, name);
		if (n && !access(buf, X_OK))
			return buf;
		path += n + (path[n] == ':');
	}
	die("%s: not found", name);
}

/* The environment without the shim: the real ssh is not part of the job. */
static char **outside_environment(void)
{
	size_t n = 0, k = 0;
	char **env;

	while (environ[n])
		n++;
	env = calloc(n + 1, sizeof(char *));
	if (!env)
		die("out of memory");
	for (size_t i = 0; i < n; i++)
		if (!is_job_variable(environ[i]))
			env[k++] = environ[i];
	return env;
}

/* The exec system call itself: the shim's execve would put the job back. */
static void exec_outside(const char *path, char **argv, char **env)
{
	syscall(SYS_execve, path, argv, env);
}

/* path with args and env, outside the job, with in_fd as its stdin. */
static pid_t spawn_outside(const char *path, char **args, char **env, int in_fd)
{
	pid_t pid = vfork();

	if (pid == 0) {
		if (dup2(in_fd, 0) == 0)
			fcntl(0, F_SETFD, 0);
		exec_outside(path, args, env);
		_exit(127);
	}
	return pid;
}

/* Runs the shell's words up to the command, then remote, with stdin from
 * a pipe that carries the token.  Returns its pid. */
static pid_t start_shell(const char *program, char **args, char *remote, const char *token)
{
	char found[4096], **env = outside_environment();
	const char *path = find_program(program, found, sizeof(found));
	int tok[2], k = 0;
	pid_t pid;

	while (args[k])
		k++;
	args[k] = remote;
	/* the token waits in the pipe: no write to a pipe whose reader failed */
	if (pipe2(tok, O_CLOEXEC) || ckpt_write_all(tok[1], token, TOKEN_LEN) ||
	    ckpt_write_all(tok[1], "\n", 1))
		die("cannot start %s: %s", program, strerror(errno));
	close(tok[1]);
	pid = spawn_outside(path, args, env, tok[0]);
	if (pid < 0)
		die("cannot start %s: %s", program, strerror(errno));
	close(tok[0]);
	args[k] = NULL;
	free(env);
	return pid;
}

/* srun's environment carries what the tasks need to join the job (srun
 * hands its environment to every task): the shim as CKPT_PRELOAD (srun
 * itself stays outside the job), the job's variables and the token. */
static char **srun_environment(const char *token)
{
	size_t n = 0, k = 0;
	char **env;

	while (environ[n])
		n++;
	env = calloc(n + 2, sizeof(char *));
	if (!env)
		die("out of memory");
	for (size_t i = 0; i < n; i++) {
		if (!strncmp(environ[i], "LD_PRELOAD=", 11)) {
			if (asprintf(&env[k++], "CKPT_PRELOAD=%s", environ[i] + 11) < 0)
				die("out of memory");
		} else {
			env[k++] = environ[i];
		}
	}
	if (asprintf(&env[k++], "%s=%s", TOKEN_VARIABLE, token) < 0)
		die("out of memory");
	return env;
}

/* srun OPTIONS ckpt-remote --serve-task BACK COMMAND...: each task runs
 * the server, which runs the command.  Returns srun's pid. */
static pid_t start_srun(const char *program, char **argv, int command, const char *back,
			const char *token)
{
	char found[4096], self[4096], **args, **env = srun_environment(token);
	const char *path = find_program(program, found, sizeof(found));
	int argc = 0, k = 0, null;
	pid_t pid;

	own_program(self);
	while (argv[argc])
		argc++;
	args = calloc(argc + 4, sizeof(char *));
	if (!args)
		die("out of memory");
	for (int i = 0; i < command; i++)
		args[k++] = argv[i];
	args[k++] = self;
	args[k++] = "--serve-task";
	args[k++] = (char *)back;
	for (int i = command; i < argc; i++)
		args[k++] = argv[i];
	null = open("/dev/null", O_RDONLY | O_CLOEXEC);	/* stdin is task 0's, through us */
	if (null < 0)
		die("cannot open /dev/null: %s", strerror(errno));
	pid = spawn_outside(path, args, env, null);
	if (pid < 0)
		die("cannot start %s: %s", program, strerror(errno));
	close(null);
	free(args);
	free(env);
	return pid;
}

/* ---- accepting the servers' connections ------------------------------ */

/* One remote command: its connections and, once it ended, its status. */
struct remote_task {
	int conns[ROLE_COUNT];
	int status;		/* wait status; -1 until the control connection says */
};

static struct remote_task *tasks;
static unsigned ntasks;		/* 0 until the first server said how many */

static void tasks_create(unsigned n)
{
	tasks = calloc(n, sizeof(*tasks));
	if (!tasks)
		die("out of memory");
	ntasks = n;
	for (unsigned t = 0; t < n; t++) {
		for (int r = 0; r < ROLE_COUNT; r++)
			tasks[t].conns[r] = -1;
		tasks[t].status = -1;
	}
}

static int listen_any(char *back, size_t size)
{
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY) };
	socklen_t len = sizeof(addr);
	char host[256];
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof(addr)) || listen(fd, 128) ||
	    getsockname(fd, (struct sockaddr *)&addr, &len))
		die("cannot listen for the remote side: %s", strerror(errno));
	if (gethostname(host, sizeof(host)))
		strcpy(host, "localhost");
	host[sizeof(host) - 1] = 0;
	snprintf(back, size, "%s:%u", host, ntohs(addr.sin_port));
	return fd;
}

/* Takes one connection if it brings the token and a role of a task not
 * yet taken (the hello's layout: remote.h). */
static void accept_one(int lfd, const char *token)
{
	char hello[HELLO_LEN + 1];
	int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	unsigned role, task, count;

	if (fd < 0)
		return;
	if (net_read_all(fd, hello, HELLO_LEN, 5000) || memcmp(hello, token, TOKEN_LEN))
		goto refuse;
	hello[HELLO_LEN] = 0;
	role = (unsigned char)hello[TOKEN_LEN] - '0';
	if (sscanf(hello + TOKEN_LEN + 1, "%8x%8x", &task, &count) != 2 || !count ||
	    count > MAX_TASKS || (ntasks && count != ntasks))
		goto refuse;
	if (!ntasks)
		tasks_create(count);
	if (role >= ROLE_COUNT || task >= ntasks || tasks[task].conns[role] >= 0)
		goto refuse;
	tasks[task].conns[role] = fd;
	return;
refuse:
	close(fd);
}

static int all_connected(void)
{
	if (!ntasks)
		return 0;
	for (unsigned t = 0; t < ntasks; t++)
		for (int r = 0; r < ROLE_COUNT; r++)
			if (tasks[t].conns[r] < 0)
				return 0;
	return 1;
}

/* Exits like ssh or srun when the real program ended before every server
 * called: its own status (it said why), 255 for a signal. */
static void launcher_ended(const char *program, int status)
{
	if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
		die("%s exited 127: it could not run, or the remote host has no ckpt-remote",
		    program);
	if (WIFEXITED(status) && !WEXITSTATUS(status))
		die("%s ended before the remote side connected back", program);
	exit(WIFEXITED(status) ? WEXITSTATUS(status) : 255);
}

/*
 * Until every server connected.  ssh ends well once its server handed
 * over, and the server may call a moment later; srun lives as long as its
 * tasks, so its end before then is always a failure.
 */
static void connect_servers(const char *program, pid_t launcher, int lfd, const char *token,
			    int launcher_stays)
{
	time_t deadline = 0;
	pid_t ended;
	int status;

	while (!all_connected()) {
		struct pollfd pfd = { .fd = lfd, .events = POLLIN };

		if (poll(&pfd, 1, 200) > 0)
			accept_one(lfd, token);
		ended = launcher > 0 ? waitpid(launcher, &status, WNOHANG) : 0;
		if (ended == launcher) {
			launcher = 0;
			if (launcher_stays || !WIFEXITED(status) || WEXITSTATUS(status))
				launcher_ended(program, status);
		} else if (ended < 0 && errno == ECHILD) {
			launcher = 0;	/* not ours to wait for any more */
		}
		if (!launcher && !deadline)
			deadline = time(NULL) + CONNECT_BACK_SECONDS;
		if (deadline && time(NULL) > deadline)
			die("the remote side never connected back");
	}
	close(lfd);
}

/* ---- relaying -------------------------------------------------------- */

/* A signal ssh or srun would pass on: every remote command's group gets
 * it too. */
static void forward_signal(int sig)
{
	unsigned char b = sig;

	for (unsigned t = 0; t < ntasks; t++)
		if (tasks[t].conns[ROLE_CONTROL] >= 0)
			ckpt_write_all(tasks[t].conns[ROLE_CONTROL], &b, 1);
	signal(sig, SIG_DFL);
	raise(sig);
}

static void forward_signals(void)
{
	static const int sigs[] = { SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2 };
	struct sigaction sa = { .sa_handler = forward_signal };

	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		sigaction(sigs[i], &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
}

/* What came on stdin for the remote command: it is written without
 * blocking, so a command that does not read its stdin never keeps the
 * relay from draining its output. */
struct stdin_relay {
	int sock, open;		/* open: fd 0 may still give more */
	size_t off, len;
	char buf[65536];
};

static void stdin_closed(struct stdin_relay *in)
{
	in->open = 0;
	if (in->off == in->len)
		shutdown(in->sock, SHUT_WR);
}

static void stdin_read(struct stdin_relay *in)
{
	ssize_t n = read(0, in->buf, sizeof(in->buf));

	if (n < 0 && errno == EINTR)
		return;
	if (n <= 0) {
		stdin_closed(in);
		return;
	}
	in->off = 0;
	in->len = n;
}

static void stdin_send(struct stdin_relay *in)
{
	ssize_t n = send(in->sock, in->buf + in->off, in->len - in->off, MSG_DONTWAIT);

	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n < 0) {		/* the command closed its stdin: drop the rest */
		in->off = in->len = 0;
		in->open = 0;
		return;
	}
	in->off += n;
	if (in->off == in->len) {
		in->off = in->len = 0;
		if (!in->open)
			shutdown(in->sock, SHUT_WR);
	}
}

/* One readable connection of task t: its output goes on, its status is kept. */
static void relay_task(struct remote_task *t, int role)
{
	int *fd = &t->conns[role];

	if (role == ROLE_CONTROL) {
		if (net_read_all(*fd, &t->status, sizeof(t->status), -1))
			t->status = -1;
	} else if (net_relay(*fd, role == ROLE_STDOUT ? 1 : 2) > 0) {
		return;
	}
	close(*fd);
	*fd = -1;
}

/* The status ssh or srun gives: the highest of the commands' exit codes,
 * 255 for one lost or killed by a signal. */
static int overall_status(void)
{
	int worst = 0;

	for (unsigned t = 0; t < ntasks; t++) {
		int s = tasks[t].status, code = s == -1 || !WIFEXITED(s) ? 255 : WEXITSTATUS(s);

		if (s == -1)
			fprintf(stderr, "ckpt-remote: the connection to remote command %u was lost\n",
				t);
		if (code > worst)
			worst = code;
	}
	return worst;
}

/* Until every command's status came and their stdout and stderr ended.
 * stdin goes to the first command (task 0), as it does through ssh. */
static int relay(int no_stdin)
{
	static struct stdin_relay in;
	struct pollfd *p = calloc(1 + 3 * ntasks, sizeof(*p));

	if (!p)
		die("out of memory");
	in.sock = tasks[0].conns[ROLE_STDIN];
	in.open = 1;
	if (no_stdin)
		stdin_closed(&in);
	for (unsigned t = 1; t < ntasks; t++)
		shutdown(tasks[t].conns[ROLE_STDIN], SHUT_WR);
	for (;;) {
		int pending = in.off < in.len, open = 0;

		p[0].fd = pending ? in.sock : in.open ? 0 : -1;
		p[0].events = pending ? POLLOUT : POLLIN;
		for (unsigned t = 0; t < ntasks; t++)
			for (int r = ROLE_STDOUT; r <= ROLE_CONTROL; r++) {
				struct pollfd *q = &p[1 + 3 * t + r - ROLE_STDOUT];

				q->fd = tasks[t].conns[r];
				q->events = POLLIN;
				open |= q->fd >= 0;
			}
		if (!open)
			break;
		if (poll(p, 1 + 3 * ntasks, -1) < 0) {
			if (errno == EINTR)
				continue;
			die("poll: %s", strerror(errno));
		}
		if (p[0].revents && pending)
			stdin_send(&in);
		else if (p[0].revents)
			stdin_read(&in);
		for (unsigned t = 0; t < ntasks; t++)
			for (int r = ROLE_STDOUT; r <= ROLE_CONTROL; r++)
				if (p[1 + 3 * t + r - ROLE_STDOUT].revents)
					relay_task(&tasks[t], r);
	}
	free(p);
	return overall_status();
}

/* ssh's stdio may be closed: the sockets must not take fds 0-2. */
static void hold_stdio(void)
{
	for (int fd = 0; fd <= 2; fd++)
		if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) != fd)
			die("cannot open /dev/null: %s", strerror(errno));
}

static void new_token(char token[TOKEN_LEN + 1])
{
	unsigned char raw[TOKEN_LEN / 2];

	if (getrandom(raw, sizeof(raw), 0) != sizeof(raw))
		die("no random token: %s", strerror(errno));
	for (size_t i = 0; i < sizeof(raw); i++)
		sprintf(token + 2 * i, "%02x", raw[i]);
}

/* A command line that starts no remote command of ours: run it as is,
 * outside the job. */
static void run_outside(const char *program, char **argv)
{
	char found[4096];

	exec_outside(find_program(program, found, sizeof(found)), argv, outside_environment());
	die("cannot run %s: %s", program, strerror(errno));
}

int client_main(const char *program, int argc, char **argv, int rsh)
{
	struct shell_args sa;
	char token[TOKEN_LEN + 1], back[300], *remote;
	pid_t shell;
	int lfd;

	argv[0] = (char *)program;
	hold_stdio();
	signal(SIGCHLD, SIG_DFL);	/* an inherited SIG_IGN would hide ssh's status */
	shell_args_parse(argc, argv, rsh, &sa);
	if (!sa.wrappable)	/* a login or a tunnel: not part of the job */
		run_outside(program, argv);
	new_token(token);
	remote_plugin_init();
	remote_set_starting(1);
	lfd = listen_any(back, sizeof(back));
	remote = server_command(back, argc, argv, sa.command);
	shell = start_shell(program, sa.shell_argv, remote, token);
	free(remote);
	connect_servers(program, shell, lfd, token, 0);
	/* the server's first process ends once it handed over: so does ssh */
	while (waitpid(shell, NULL, 0) < 0 && errno == EINTR)
		;
	forward_signals();
	remote_set_starting(0);
	return relay(sa.no_stdin);
}

/*
 * srun stays outside the job and keeps running (Slurm ends a step whose
 * srun is gone), but nothing of the job depends on it once the tasks
 * connected back: after a restart it is simply not there.
 */
int srun_client_main(const char *program, int argc, char **argv)
{
	char token[TOKEN_LEN + 1], back[300];
	int command, lfd, status;
	pid_t srun;

	argv[0] = (char *)program;
	hold_stdio();
	signal(SIGCHLD, SIG_DFL);
	command = srun_command_index(argc, argv);
	if (!command)
		run_outside(program, argv);
	new_token(token);
	remote_plugin_init();
	remote_set_starting(1);
	lfd = listen_any(back, sizeof(back));
	srun = start_srun(program, argv, command, back, token);
	connect_servers(program, srun, lfd, token, 1);
	forward_signals();
	remote_set_starting(0);
	status = relay(0);
	while (waitpid(srun, NULL, 0) < 0 && errno == EINTR)
		;
	return status;
}
