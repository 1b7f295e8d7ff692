/*
 * Issue 37: Unix datagram sockets whose peer closed, in the shapes
 * programs give them: a socketpair whose one end a forked child wrote
 * datagrams to and ended (queue full and empty); a socket connected to a
 * bound name (relative to the working directory) whose owner sent to it and closed (its socket file left in
 * place, or removed); and one that found its peer gone before the
 * checkpoint.  The kernel keeps such a socket connected to the dead peer:
 * it still names the peer, gives the queued datagrams one by one, then
 * EAGAIN; its first send fails with ECONNREFUSED (which drops what is
 * still queued and disconnects it), later ones with ENOTCONN.
 *
 *   socket_dgram_dead_peers [steps] [ms-per-step] [dir]
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stddef.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include "zdtm.h"

static const char *const words[] = { "first", "a second, longer datagram", "3", NULL };
static const char *const none[] = { NULL };

enum order { READ_FIRST, SEND_FIRST, REFUSED_BEFORE };

struct end {
	const char *what;
	int fd;
	const char *const *queued;
	enum order order;
	struct sockaddr_un peer;	/* its name, if it had one */
	socklen_t peer_len;
	int unlink_peer;		/* the owner removed its socket file */
};

static void send_all(int fd, const char *const *msgs)
{
	for (; *msgs; msgs++)
		zdtm_check(send(fd, *msgs, strlen(*msgs), 0) == (ssize_t)strlen(*msgs),
			   "send: %m");
}

/* A forked child sends on its end of a pair and ends. */
static void pair_peer_ends(struct end *e)
{
	int sv[2];
	pid_t child;

	zdtm_check(socketpair(AF_UNIX, SOCK_DGRAM, 0, sv) == 0, "socketpair: %m");
	child = fork();
	zdtm_check(child >= 0, "fork: %m");
	if (child == 0) {
		close(sv[0]);
		send_all(sv[1], e->queued);
		_exit(0);
	}
	close(sv[1]);
	zdtm_check(waitpid(child, NULL, 0) == child, "waitpid: %m");
	e->fd = sv[0];
	e->peer.sun_family = AF_UNIX;	/* unnamed: the family alone */
	e->peer_len = sizeof(sa_family_t);
}

static socklen_t name(struct sockaddr_un *a, const char *what, int n)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	snprintf(a->sun_path, sizeof(a->sun_path), "dgram-%s-%d-%d", what, getpid(), n);
	unlink(a->sun_path);
	return offsetof(struct sockaddr_un, sun_path) + strlen(a->sun_path) + 1;
}

/* A bound server and a bound client connected to each other; the server
 * sends, then closes (and removes its name, or not). */
static void named_peer_closes(struct end *e, int n)
{
	struct sockaddr_un mine;
	socklen_t mine_len = name(&mine, "client", n);
	int srv = socket(AF_UNIX, SOCK_DGRAM, 0), c = socket(AF_UNIX, SOCK_DGRAM, 0);

	e->peer_len = name(&e->peer, "server", n);
	zdtm_check(srv >= 0 && c >= 0, "socket: %m");
	zdtm_check(bind(srv, (void *)&e->peer, e->peer_len) == 0, "bind: %m");
	zdtm_check(bind(c, (void *)&mine, mine_len) == 0, "bind: %m");
	zdtm_check(connect(c, (void *)&e->peer, e->peer_len) == 0, "connect: %m");
	zdtm_check(connect(srv, (void *)&mine, mine_len) == 0, "connect: %m");
	send_all(srv, e->queued);
	close(srv);
	if (e->unlink_peer)
		unlink(e->peer.sun_path);
	e->fd = c;
}

static void check_peer_name(const struct end *e)
{
	struct sockaddr_un a;
	socklen_t len = sizeof(a);

	zdtm_check(getpeername(e->fd, (void *)&a, &len) == 0, "%s: getpeername: %m", e->what);
	zdtm_check(len == e->peer_len && !memcmp(&a, &e->peer, len),
		   "%s: the peer's name is %.*s (%u bytes), not %s", e->what,
		   (int)(len > 2 ? len - 2 : 0), a.sun_path, len, e->peer.sun_path);
}

static uint64_t read_queue(const struct end *e, uint64_t hash)
{
	char buf[256];
	struct sockaddr_un from;
	socklen_t len;
	ssize_t n;

	for (const char *const *m = e->queued; *m; m++) {
		len = sizeof(from);
		n = recvfrom(e->fd, buf, sizeof(buf), MSG_DONTWAIT, (void *)&from, &len);
		zdtm_check(n == (ssize_t)strlen(*m) && !memcmp(buf, *m, n),
			   "%s: datagram %ld: %zd bytes (%m), expected \"%s\"", e->what,
			   (long)(m - e->queued), n, *m);
		/* an unnamed sender gives no address */
		zdtm_check(e->peer_len <= sizeof(sa_family_t) ? len == 0 :
			   len == e->peer_len && !memcmp(&from, &e->peer, len),
			   "%s: datagram %ld comes from another address (%u bytes)", e->what,
			   (long)(m - e->queued), len);
		for (ssize_t i = 0; i < n; i++)
			hash = zdtm_mix(hash, (unsigned char)buf[i]);
	}
	return hash;
}

static void nothing_queued(const struct end *e, const char *when)
{
	char c;

	zdtm_check(recv(e->fd, &c, 1, MSG_DONTWAIT) == -1 && errno == EAGAIN,
		   "%s: %s, a read did not say EAGAIN: %m", e->what, when);
}

/* The first send finds the peer dead and disconnects; the next has no peer. */
static void refused_then_unconnected(const struct end *e)
{
	zdtm_check(send(e->fd, "x", 1, 0) == -1 && errno == ECONNREFUSED,
		   "%s: a send to the dead peer did not fail with ECONNREFUSED: %m", e->what);
	zdtm_check(send(e->fd, "x", 1, 0) == -1 && errno == ENOTCONN,
		   "%s: a second send did not fail with ENOTCONN: %m", e->what);
}

static void unconnected(const struct end *e)
{
	struct sockaddr_un a;
	socklen_t len = sizeof(a);

	zdtm_check(getpeername(e->fd, (void *)&a, &len) == -1 && errno == ENOTCONN,
		   "%s: still connected after ECONNREFUSED: %m", e->what);
	zdtm_check(send(e->fd, "x", 1, 0) == -1 && errno == ENOTCONN,
		   "%s: a send did not fail with ENOTCONN: %m", e->what);
}

static uint64_t check_end(const struct end *e, uint64_t hash)
{
	switch (e->order) {
	case READ_FIRST:
		check_peer_name(e);
		hash = read_queue(e, hash);
		nothing_queued(e, "after the queued datagrams");
		refused_then_unconnected(e);
		unconnected(e);
		break;
	case SEND_FIRST:	/* ECONNREFUSED drops the queue */
		check_peer_name(e);
		refused_then_unconnected(e);
		nothing_queued(e, "after ECONNREFUSED");
		unconnected(e);
		break;
	case REFUSED_BEFORE:
		unconnected(e);
		hash = read_queue(e, hash);	/* nothing was queued */
		nothing_queued(e, "refused before");
		break;
	}
	return hash;
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	uint64_t hash = 0;
	struct end ends[] = {
		{ .what = "pair, peer ended, datagrams queued", .queued = words },
		{ .what = "pair, peer ended, nothing queued", .queued = none },
		{ .what = "pair, peer ended, send before reading", .queued = words,
		  .order = SEND_FIRST },
		{ .what = "pair, peer ended, refused before the checkpoint", .queued = none,
		  .order = REFUSED_BEFORE },
		{ .what = "named peer closed, its file left, datagrams queued", .queued = words },
		{ .what = "named peer closed, its file removed, datagrams queued", .queued = words,
		  .unlink_peer = 1 },
		{ .what = "named peer closed, its file removed, nothing queued", .queued = none,
		  .unlink_peer = 1 },
	};
	const int nends = sizeof(ends) / sizeof(ends[0]);

	zdtm_args(argc, argv, &steps, &pace);
	/* names relative to it: a test's directory may be too long for one */
	zdtm_check(chdir(argc > 3 ? argv[3] : ".") == 0, "chdir: %m");
	signal(SIGPIPE, SIG_IGN);
	for (int i = 0; i < nends; i++) {
		if (i < 4)
			pair_peer_ends(&ends[i]);
		else
			named_peer_closes(&ends[i], i);
		if (ends[i].order == REFUSED_BEFORE)
			refused_then_unconnected(&ends[i]);
	}
	printf("READY\n");
	fflush(stdout);
	hash = zdtm_steps_hash(hash, steps, pace);
	zdtm_hold();
	for (int i = 0; i < nends; i++)
		hash = check_end(&ends[i], hash);
	for (int i = 4; i < nends; i++) {
		struct sockaddr_un a;
		socklen_t len = sizeof(a);

		if (!getsockname(ends[i].fd, (void *)&a, &len) && len > 2)
			unlink(a.sun_path);
		unlink(ends[i].peer.sun_path);
	}
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
