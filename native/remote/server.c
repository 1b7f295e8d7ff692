/*
 * The remote side of ckpt-remote, started by sshd or as an srun task, with
 * the shim loaded (see remote.h).  Through ssh, its first process reads
 * the token from the session, forks the server and ends once the server
 * has connected back, so that the ssh session ends too; as an srun task it
 * serves itself.  The server runs the command in a process group of its
 * own with the connections as its stdio, passes on the client's signals,
 * and sends the command's wait status when it ends.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "remote.h"

static int child_pipe[2] = { -1, -1 };	/* SIGCHLD wakes the poll */

static void read_token(char *token)
{
	if (net_read_all(0, token, TOKEN_LEN, 60000))
		die("no token on stdin: run by ckpt-remote --ssh only");
	token[TOKEN_LEN] = 0;
}

/* Where the client may be, best first: the address that came with the
 * session (the first word of sshd's SSH_CLIENT, srun's
 * SLURM_SRUN_COMM_HOST), then its host name resolved here (rsh; or a jump
 * host came between).  Returns how many. */
static int client_addresses(const char *back, struct sockaddr_in addrs[2], const char *hint)
{
	const char *colon = strrchr(back, ':');
	char host[256];
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res;
	int n = 0;

	if (!colon || colon == back)
		die("bad address %s", back);
	memset(addrs, 0, 2 * sizeof(*addrs));
	addrs[0].sin_family = addrs[1].sin_family = AF_INET;
	addrs[0].sin_port = addrs[1].sin_port = htons(atoi(colon + 1));
	if (hint) {
		snprintf(host, sizeof(host), "%.*s", (int)strcspn(hint, " "), hint);
		if (!strncmp(host, "::ffff:", 7))
			memmove(host, host + 7, strlen(host + 7) + 1);
		if (inet_pton(AF_INET, host, &addrs[n].sin_addr) == 1)
			n++;
	}
	snprintf(host, sizeof(host), "%.*s", (int)(colon - back), back);
	if (!getaddrinfo(host, NULL, &hints, &res)) {
		addrs[n].sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
		if (!n || addrs[1].sin_addr.s_addr != addrs[0].sin_addr.s_addr)
			n++;
		freeaddrinfo(res);
	}
	if (!n)
		die("cannot resolve %s", host);
	return n;
}

/* Which task this server is, of how many (through ssh: 0 of 1). */
struct task_id {
	unsigned task, count;
};

/* One connection, with the token, its role and task; -1 (errno) on failure. */
static int connect_role(const struct sockaddr_in *addr, const char *token, int role,
			struct task_id id)
{
	char hello[HELLO_LEN + 1];
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(hello, sizeof(hello), "%.*s%c%08x%08x", TOKEN_LEN, token, '0' + role,
		 id.task, id.count);
	if (fd < 0)
		return -1;
	if (connect(fd, (const struct sockaddr *)addr, sizeof(*addr)) ||
	    ckpt_write_all(fd, hello, HELLO_LEN)) {
		int err = errno;

		close(fd);
		errno = err;
		return -1;
	}
	return fd;
}

/* The four connections, to the first address that answers. */
static void connect_back(const struct sockaddr_in *addrs, int naddrs, const char *token,
			 struct task_id id, int conns[ROLE_COUNT])
{
	const struct sockaddr_in *addr = NULL;

	for (int i = 0; i < naddrs && !addr; i++) {
		conns[0] = connect_role(&addrs[i], token, 0, id);
		if (conns[0] >= 0)
			addr = &addrs[i];
	}
	if (!addr)
		die("cannot connect back to %s:%d: %s", inet_ntoa(addrs[naddrs - 1].sin_addr),
		    ntohs(addrs[0].sin_port), strerror(errno));
	for (int r = 1; r < ROLE_COUNT; r++) {
		conns[r] = connect_role(addr, token, r, id);
		if (conns[r] < 0)
			die("cannot connect back to %s:%d: %s", inet_ntoa(addr->sin_addr),
			    ntohs(addr->sin_port), strerror(errno));
	}
}

static void on_child(int sig)
{
	int saved = errno;

	if (write(child_pipe[1], "c", 1) < 0)
		errno = saved;
	errno = saved;
}

static const char *user_shell(void)
{
	const char *shell = getenv("SHELL");
	struct passwd *pw;

	if (shell && *shell)
		return shell;
	pw = getpwuid(getuid());
	return pw && pw->pw_shell && *pw->pw_shell ? pw->pw_shell : "/bin/sh";
}

/* The command, as ssh runs it (the user's shell with -c command) or as
 * srun does (argv, found in PATH). */
static pid_t start_command(const char *command, char **argv)
{
	const char *shell = user_shell();
	struct sigaction sa = { .sa_handler = on_child, .sa_flags = SA_RESTART };
	pid_t pid;

	if (pipe2(child_pipe, O_CLOEXEC | O_NONBLOCK) || sigaction(SIGCHLD, &sa, NULL))
		die("cannot watch the command: %s", strerror(errno));
	pid = fork();
	if (pid == 0) {
		setpgid(0, 0);
		signal(SIGPIPE, SIG_DFL);
		if (argv) {
			execvp(argv[0], argv);
			fprintf(stderr, "ckpt-remote: cannot run %s: %s\n", argv[0],
				strerror(errno));
		} else {
			execl(shell, shell, "-c", command, (char *)NULL);
			fprintf(stderr, "ckpt-remote: cannot run %s: %s\n", shell,
				strerror(errno));
		}
		_exit(127);
	}
	if (pid < 0)
		die("cannot start the command: %s", strerror(errno));
	setpgid(pid, pid);
	return pid;
}

/* Until the command ended: the client's signals go to its group; an srun
 * task's PMI requests are relayed or answered (pmi_proxy.c). */
static int serve(pid_t pid, int ctl)
{
	int status;

	for (;;) {
		struct pollfd p[4] = {
			{ .fd = ctl, .events = POLLIN },
			{ .fd = child_pipe[0], .events = POLLIN },
		};
		int n = 2 + pmi_proxy_pollfds(p + 2);
		unsigned char sig;
		char drain[64];

		if (waitpid(pid, &status, WNOHANG) == pid)
			return status;
		if (poll(p, n, pmi_proxy_busy() ? 0 : -1) < 0 && errno != EINTR)
			die("poll: %s", strerror(errno));
		pmi_proxy_serve(p + 2, n - 2, pid);
		if (p[1].revents)
			while (read(child_pipe[0], drain, sizeof(drain)) > 0)
				;
		if (p[0].revents && ctl >= 0) {
			ssize_t r = read(ctl, &sig, 1);

			if (r == 1 && sig > 0 && sig < NSIG) {
				kill(-pid, sig);
			} else if (r == 0 || (r < 0 && errno != EINTR)) {
				/* the client is gone: a hang-up, as sshd gives */
				kill(-pid, SIGHUP);
				ctl = -1;
			}
		}
	}
}

/* The command, with the stdin, stdout and stderr connections as its
 * stdio; this process lets go of them (their ends are the command's) and
 * of its own stdio (sshd's session, slurmstepd's pipes). */
static pid_t run_command(const int conns[ROLE_COUNT], const char *command, char **argv)
{
	pid_t pid;
	int null;

	for (int r = ROLE_STDIN; r <= ROLE_STDERR; r++)
		if (dup2(conns[r], r) != r)
			die("dup2: %s", strerror(errno));
	pid = start_command(command, argv);
	null = open("/dev/null", O_RDWR);
	for (int fd = 0; fd <= 2; fd++)
		dup2(null, fd);
	for (int r = ROLE_STDIN; r <= ROLE_STDERR; r++)
		close(conns[r]);
	if (null > 2)
		close(null);
	return pid;
}

/* The detached server: returns only in the first process, with its status. */
static int start_server(const struct sockaddr_in *addrs, int naddrs, const char *token,
			const char *command)
{
	struct task_id only = { 0, 1 };
	int handed[2], conns[ROLE_COUNT], status;
	char ok = 0;
	pid_t pid;

	if (pipe2(handed, O_CLOEXEC))
		die("pipe: %s", strerror(errno));
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid > 0) {		/* the one sshd waits for */
		close(handed[1]);
		return net_read_all(handed[0], &ok, 1, -1) || ok != 'k' ? 255 : 0;
	}
	close(handed[0]);
	setsid();
	connect_back(addrs, naddrs, token, only, conns);
	pid = run_command(conns, command, NULL);
	remote_set_starting(0);
	if (ckpt_write_all(handed[1], "k", 1))
		_exit(255);
	close(handed[1]);
	status = serve(pid, conns[ROLE_CONTROL]);
	ckpt_write_all(conns[ROLE_CONTROL], &status, sizeof(status));
	_exit(0);
}

int server_main(const char *back, const char *command)
{
	char token[TOKEN_LEN + 1];
	struct sockaddr_in addrs[2];
	int naddrs;

	remote_plugin_init();
	remote_set_starting(1);
	read_token(token);
	naddrs = client_addresses(back, addrs, getenv("SSH_CLIENT"));
	signal(SIGPIPE, SIG_IGN);
	return start_server(addrs, naddrs, token, command);
}

/* An unsigned number from the environment, or fallback. */
static unsigned env_number(const char *name, const char *other, unsigned fallback)
{
	const char *v = getenv(name);

	if (!v && other)
		v = getenv(other);
	return v && *v ? (unsigned)strtoul(v, NULL, 10) : fallback;
}

/*
 * One task of an srun step: the task's process itself serves (Slurm
 * ends what a step leaves behind, so it cannot detach) and ends with the
 * command's status once it sent it.
 */
int server_task_main(const char *back, char **argv)
{
	const char *from_env = getenv(TOKEN_VARIABLE);
	struct task_id id = {
		.task = env_number("SLURM_PROCID", NULL, 0),
		.count = env_number("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", 1),
	};
	char token[TOKEN_LEN + 1];
	struct sockaddr_in addrs[2];
	int naddrs, conns[ROLE_COUNT], status;
	pid_t pid;

	if (!from_env || strlen(from_env) != TOKEN_LEN)
		die("no token in the environment: run by ckpt-remote --srun only");
	memcpy(token, from_env, sizeof(token));
	unsetenv(TOKEN_VARIABLE);	/* not the command's business */
	remote_plugin_init();
	remote_set_starting(1);
	naddrs = client_addresses(back, addrs, getenv("SLURM_SRUN_COMM_HOST"));
	signal(SIGPIPE, SIG_IGN);
	connect_back(addrs, naddrs, token, id, conns);
	pmi_proxy_prepare(id.task, id.count);
	pid = run_command(conns, NULL, argv);
	pmi_proxy_started();
	remote_set_starting(0);
	status = serve(pid, conns[ROLE_CONTROL]);
	ckpt_write_all(conns[ROLE_CONTROL], &status, sizeof(status));
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
