/*
 * The launching side of ckpt-remote, run in place of ssh/rsh by a process
 * of the job (see remote.h).  It starts the server through the real
 * program, accepts the server's four connections, then relays its stdio
 * and ends with the remote command's exit status.
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

extern char **environ;

static int control_fd = -1;

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
static char *server_command(const char *back, int argc, char **argv, int first)
{
	char self[4096], *buf = NULL, *words = NULL;
	size_t len = 0, words_len = 0;
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	if (n <= 0)
		die("cannot find its own program: %s", strerror(errno));
	self[n] = 0;
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
	if (pipe2(tok, O_CLOEXEC) || net_write_all(tok[1], token, TOKEN_LEN) ||
	    net_write_all(tok[1], "\n", 1))
		die("cannot start %s: %s", program, strerror(errno));
	close(tok[1]);
	pid = vfork();
	if (pid == 0) {
		if (dup2(tok[0], 0) == 0)
			fcntl(0, F_SETFD, 0);
		exec_outside(path, args, env);
		_exit(127);
	}
	if (pid < 0)
		die("cannot start %s: %s", program, strerror(errno));
	close(tok[0]);
	args[k] = NULL;
	free(env);
	return pid;
}

/* ---- accepting the server's connections ------------------------------ */

static int listen_any(char *back, size_t size)
{
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY) };
	socklen_t len = sizeof(addr);
	char host[256];
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof(addr)) || listen(fd, 8) ||
	    getsockname(fd, (struct sockaddr *)&addr, &len))
		die("cannot listen for the remote side: %s", strerror(errno));
	if (gethostname(host, sizeof(host)))
		strcpy(host, "localhost");
	host[sizeof(host) - 1] = 0;
	snprintf(back, size, "%s:%u", host, ntohs(addr.sin_port));
	return fd;
}

/* Takes one connection if it brings the token and a role not yet taken. */
static void accept_one(int lfd, const char *token, int conns[ROLE_COUNT])
{
	char hello[TOKEN_LEN + 1];
	int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	unsigned role;

	if (fd < 0)
		return;
	if (net_read_all(fd, hello, sizeof(hello), 5000) || memcmp(hello, token, TOKEN_LEN)) {
		close(fd);
		return;
	}
	role = (unsigned char)hello[TOKEN_LEN] - '0';
	if (role >= ROLE_COUNT || conns[role] >= 0) {
		close(fd);
		return;
	}
	conns[role] = fd;
}

static int all_connected(const int conns[ROLE_COUNT])
{
	for (int r = 0; r < ROLE_COUNT; r++)
		if (conns[r] < 0)
			return 0;
	return 1;
}

/* Exits like ssh when the real program failed before the server called. */
static void shell_ended(const char *program, int status)
{
	if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
		die("%s exited 127: it could not run, or the remote host has no ckpt-remote",
		    program);
	if (WIFEXITED(status))
		exit(WEXITSTATUS(status) ? WEXITSTATUS(status) : 255);
	exit(255);
}

static void connect_server(const char *program, pid_t shell, int lfd, const char *token,
			   int conns[ROLE_COUNT])
{
	time_t deadline = 0;
	pid_t ended;
	int status;

	while (!all_connected(conns)) {
		struct pollfd pfd = { .fd = lfd, .events = POLLIN };

		if (poll(&pfd, 1, 200) > 0)
			accept_one(lfd, token, conns);
		ended = shell > 0 ? waitpid(shell, &status, WNOHANG) : 0;
		if (ended == shell) {
			shell = 0;
			if (!WIFEXITED(status) || WEXITSTATUS(status))
				shell_ended(program, status);
		} else if (ended < 0 && errno == ECHILD) {
			shell = 0;	/* not ours to wait for any more */
		}
		if (!shell && !deadline)
			deadline = time(NULL) + CONNECT_BACK_SECONDS;
		if (deadline && time(NULL) > deadline)
			die("the remote side never connected back");
	}
	close(lfd);
	/* the server's first process ends once it handed over: so does ssh */
	if (shell > 0)
		while (waitpid(shell, &status, 0) < 0 && errno == EINTR)
			;
}

/* ---- relaying -------------------------------------------------------- */

/* A signal ssh would pass on as the end of its session: the remote
 * command's group gets it too. */
static void forward_signal(int sig)
{
	unsigned char b = sig;

	if (control_fd >= 0 && write(control_fd, &b, 1) < 0)
		b = 0;
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

/* Until the command's status came and its stdout and stderr ended. */
static int relay(int conns[ROLE_COUNT], int no_stdin)
{
	static struct stdin_relay in;
	int out = conns[ROLE_STDOUT], err = conns[ROLE_STDERR], ctl = conns[ROLE_CONTROL];
	int status = -1;

	in.sock = conns[ROLE_STDIN];
	in.open = 1;
	if (no_stdin)
		stdin_closed(&in);
	while (out >= 0 || err >= 0 || ctl >= 0) {
		int pending = in.off < in.len;
		struct pollfd p[4] = {
			{ .fd = pending ? in.sock : in.open ? 0 : -1,
			  .events = pending ? POLLOUT : POLLIN },
			{ .fd = out, .events = POLLIN },
			{ .fd = err, .events = POLLIN },
			{ .fd = ctl, .events = POLLIN },
		};

		if (poll(p, 4, -1) < 0) {
			if (errno == EINTR)
				continue;
			die("poll: %s", strerror(errno));
		}
		if (p[0].revents && pending)
			stdin_send(&in);
		else if (p[0].revents)
			stdin_read(&in);
		if (p[1].revents && net_relay(out, 1) <= 0) {
			close(out);
			out = -1;
		}
		if (p[2].revents && net_relay(err, 2) <= 0) {
			close(err);
			err = -1;
		}
		if (p[3].revents) {
			if (net_read_all(ctl, &status, sizeof(status), -1))
				status = -1;
			control_fd = -1;
			close(ctl);
			ctl = -1;
		}
	}
	if (status == -1) {
		fprintf(stderr, "ckpt-remote: the connection to the remote command was lost\n");
		return 255;
	}
	return WIFEXITED(status) ? WEXITSTATUS(status) : 255;
}

/* ssh's stdio may be closed: the sockets must not take fds 0-2. */
static void hold_stdio(void)
{
	for (int fd = 0; fd <= 2; fd++)
		if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) != fd)
			die("cannot open /dev/null: %s", strerror(errno));
}

int client_main(const char *program, int argc, char **argv, int rsh)
{
	struct shell_args sa;
	unsigned char raw[TOKEN_LEN / 2];
	char token[TOKEN_LEN + 1], back[300], *remote;
	int conns[ROLE_COUNT] = { -1, -1, -1, -1 }, lfd;
	pid_t shell;

	argv[0] = (char *)program;
	hold_stdio();
	signal(SIGCHLD, SIG_DFL);	/* an inherited SIG_IGN would hide ssh's status */
	shell_args_parse(argc, argv, rsh, &sa);
	if (!sa.wrappable) {	/* a login or a tunnel: not part of the job */
		char found[4096];

		exec_outside(find_program(program, found, sizeof(found)), argv,
			     outside_environment());
		die("cannot run %s: %s", program, strerror(errno));
	}
	if (getrandom(raw, sizeof(raw), 0) != sizeof(raw))
		die("no random token: %s", strerror(errno));
	for (size_t i = 0; i < sizeof(raw); i++)
		sprintf(token + 2 * i, "%02x", raw[i]);
	remote_plugin_init();
	remote_set_starting(1);
	lfd = listen_any(back, sizeof(back));
	remote = server_command(back, argc, argv, sa.command);
	shell = start_shell(program, sa.shell_argv, remote, token);
	free(remote);
	connect_server(program, shell, lfd, token, conns);
	control_fd = conns[ROLE_CONTROL];
	forward_signals();
	remote_set_starting(0);
	return relay(conns, sa.no_stdin);
}
