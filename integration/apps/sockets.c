/*
 * Sockets between a parent and its child, with bytes in flight: a stream
 * socketpair, a datagram socketpair, a connection accepted on a Unix
 * socket with a file name, one accepted on an abstract Unix name, and a
 * TCP connection on 127.0.0.1.  The parent keeps AHEAD tokens queued on
 * every channel; the child answers each with a mix of it on the same
 * channel.  At the end the parent checks every answer, the child's exit
 * status, that the listeners still accept connections, and the socket
 * options it set.
 */
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include "zdtm.h"

#define AHEAD 8
#define CHANNELS 5

static const char *names[CHANNELS] = { "stream pair", "datagram pair", "unix named", "unix abstract",
				       "tcp" };

static void xfer(int fd, uint64_t *v, int writing, const char *what)
{
	ssize_t n = writing ? write(fd, v, sizeof(*v)) : read(fd, v, sizeof(*v));

	zdtm_check(n == sizeof(*v), "%s %s: %zd", what, writing ? "write" : "read", n);
}

static socklen_t unix_addr(struct sockaddr_un *a, const char *name, int abstract)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	snprintf(a->sun_path + abstract, sizeof(a->sun_path) - 1, "%s", name);
	return offsetof(struct sockaddr_un, sun_path) + abstract + strlen(name) + (abstract ? 0 : 1);
}

static int listener(int domain, struct sockaddr *a, socklen_t *len)
{
	int s = socket(domain, SOCK_STREAM, 0);
	int one = 1;

	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	zdtm_check(s >= 0 && bind(s, a, *len) == 0 && listen(s, 4) == 0, "listen");
	*len = domain == AF_INET ? sizeof(struct sockaddr_in) : *len;
	zdtm_check(getsockname(s, a, len) == 0, "getsockname");
	return s;
}

static int dial(int domain, const struct sockaddr *a, socklen_t len)
{
	int s = socket(domain, SOCK_STREAM, 0);

	zdtm_check(s >= 0 && connect(s, a, len) == 0, "connect");
	return s;
}

/* Options a restart must give back: on the TCP connection and the stream pair. */
static const struct linger linger_5s = { 1, 5 };
static const struct timeval send_timeout = { 30, 500000 };

static void set_int(int s, int level, int name, int v)
{
	zdtm_check(setsockopt(s, level, name, &v, sizeof(v)) == 0, "setsockopt %d/%d", level, name);
}

static void check_int(int s, int level, int name, int want, const char *what)
{
	int v = -1;
	socklen_t len = sizeof(v);

	zdtm_check(getsockopt(s, level, name, &v, &len) == 0 && v == want,
		   "%s is %d, was set to give %d", what, v, want);
}

static void set_options(int *parent)
{
	set_int(parent[4], IPPROTO_TCP, TCP_NODELAY, 1);
	set_int(parent[4], SOL_SOCKET, SO_KEEPALIVE, 1);
	set_int(parent[4], IPPROTO_TCP, TCP_KEEPIDLE, 77);
	set_int(parent[4], SOL_SOCKET, SO_RCVBUF, 65536);
	zdtm_check(setsockopt(parent[4], SOL_SOCKET, SO_LINGER, &linger_5s, sizeof(linger_5s)) == 0,
		   "SO_LINGER");
	zdtm_check(setsockopt(parent[4], SOL_SOCKET, SO_SNDTIMEO, &send_timeout,
			      sizeof(send_timeout)) == 0, "SO_SNDTIMEO");
	set_int(parent[0], SOL_SOCKET, SO_SNDBUF, 32768);
	set_int(parent[0], SOL_SOCKET, SO_PASSCRED, 1);
}

static void check_options(int *parent)
{
	struct linger l;
	struct timeval t;
	socklen_t len = sizeof(l);

	check_int(parent[4], IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY");
	check_int(parent[4], SOL_SOCKET, SO_KEEPALIVE, 1, "SO_KEEPALIVE");
	check_int(parent[4], IPPROTO_TCP, TCP_KEEPIDLE, 77, "TCP_KEEPIDLE");
	check_int(parent[4], SOL_SOCKET, SO_RCVBUF, 2 * 65536, "SO_RCVBUF");	/* doubled */
	zdtm_check(getsockopt(parent[4], SOL_SOCKET, SO_LINGER, &l, &len) == 0 &&
		   l.l_onoff == 1 && l.l_linger == 5, "SO_LINGER is %d %d", l.l_onoff, l.l_linger);
	len = sizeof(t);
	zdtm_check(getsockopt(parent[4], SOL_SOCKET, SO_SNDTIMEO, &t, &len) == 0 &&
		   t.tv_sec == 30 && t.tv_usec == 500000, "SO_SNDTIMEO is %ld.%06ld",
		   (long)t.tv_sec, (long)t.tv_usec);
	check_int(parent[0], SOL_SOCKET, SO_SNDBUF, 2 * 32768, "SO_SNDBUF");
	check_int(parent[0], SOL_SOCKET, SO_PASSCRED, 1, "SO_PASSCRED");
}

static int mask = 0x1f;	/* channels in use (argv[4], for debugging) */

static void child(int ch[CHANNELS])
{
	uint64_t token, hash = 0;
	long n = 0;

	/* tokens arrive in the same order on every channel */
	for (;;) {
		for (int c = 0; c < CHANNELS; c++) {
			if (!(mask & (1 << c)))
				continue;
			if (read(ch[c], &token, sizeof(token)) != sizeof(token)) {
				zdtm_check(!(mask & ((1 << c) - 1)), "child: channel %s ended early",
					   names[c]);
				_exit((int)(hash % 127) + (n > 0));
			}
			token = zdtm_mix(token, c);
			hash = zdtm_mix(hash, token);
			xfer(ch[c], &token, 1, names[c]);
		}
		n++;
	}
}

int main(int argc, char **argv)
{
	long steps = 200, pace = 10, sent = 0;
	int sp[2], dp[2], ln[3], parent[CHANNELS], kid[CHANNELS], status;
	struct sockaddr_un named, abstract;
	struct sockaddr_in tcp = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len[3];
	char path[64];
	uint64_t token = 7, answer, hash = 0;
	pid_t pid;

	zdtm_args(argc, argv, &steps, &pace);
	if (argc > 3)
		zdtm_check(chdir(argv[3]) == 0, "chdir %s", argv[3]);
	if (argc > 4)
		mask = (int)strtol(argv[4], NULL, 0);
	snprintf(path, sizeof(path), "sockets-%d.sock", getpid());
	unlink(path);
	len[0] = unix_addr(&named, path, 0);
	len[1] = unix_addr(&abstract, path, 1);
	len[2] = sizeof(tcp);
	ln[0] = listener(AF_UNIX, (struct sockaddr *)&named, &len[0]);
	ln[1] = listener(AF_UNIX, (struct sockaddr *)&abstract, &len[1]);
	ln[2] = listener(AF_INET, (struct sockaddr *)&tcp, &len[2]);
	zdtm_check(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0, "socketpair");
	zdtm_check(socketpair(AF_UNIX, SOCK_DGRAM, 0, dp) == 0, "socketpair");
	pid = fork();
	zdtm_check(pid >= 0, "fork");
	if (pid == 0) {
		kid[0] = sp[1];
		kid[1] = dp[1];
		kid[2] = dial(AF_UNIX, (struct sockaddr *)&named, len[0]);
		kid[3] = dial(AF_UNIX, (struct sockaddr *)&abstract, len[1]);
		kid[4] = dial(AF_INET, (struct sockaddr *)&tcp, len[2]);
		close(sp[0]);
		close(dp[0]);
		for (int i = 0; i < 3; i++)
			close(ln[i]);
		child(kid);
	}
	close(sp[1]);
	close(dp[1]);
	parent[0] = sp[0];
	parent[1] = dp[0];
	for (int i = 0; i < 3; i++) {
		parent[2 + i] = accept(ln[i], NULL, NULL);
		zdtm_check(parent[2 + i] >= 0, "accept %s", names[2 + i]);
	}
	set_options(parent);
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		for (; sent < steps && sent < step + AHEAD; sent++) {
			token = zdtm_mix(token, sent);
			for (int c = 0; c < CHANNELS; c++)
				if (mask & (1 << c))
					xfer(parent[c], &token, 1, names[c]);
		}
		for (int c = 0; c < CHANNELS; c++) {
			if (!(mask & (1 << c)))
				continue;
			xfer(parent[c], &answer, 0, names[c]);
			hash = zdtm_mix(hash, answer);
		}
		zdtm_pace(pace);
	}
	zdtm_hold();
	for (int c = 0; c < CHANNELS; c++)
		shutdown(parent[c], SHUT_RDWR);
	zdtm_check(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) > 0,
		   "child status %x", status);
	for (int i = 0; i < 3; i++) {		/* the listeners still listen */
		struct sockaddr *a = i == 0 ? (struct sockaddr *)&named :
				     i == 1 ? (struct sockaddr *)&abstract : (struct sockaddr *)&tcp;
		int c = dial(i == 2 ? AF_INET : AF_UNIX, a, len[i]);
		int s = accept(ln[i], NULL, NULL);

		zdtm_check(s >= 0, "listener %s after the run", names[2 + i]);
		close(c);
		close(s);
	}
	check_options(parent);
	unlink(path);
	zdtm_pass("%016llx %d", (unsigned long long)hash, WEXITSTATUS(status));
	return 0;
}
