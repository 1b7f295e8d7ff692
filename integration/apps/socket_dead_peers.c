/*
 * Issue 37, shape 2: Unix stream and seqpacket sockets whose peer was
 * closed, in the shape programs give them: a socketpair whose one end a
 * forked child wrote to and closed (by ending), with bytes still queued
 * and with none; and an end whose peer, still open, shut down writing
 * after its last words.  At the end each
 * must give its queued bytes (seqpacket: message by message), then EOF;
 * writing to a closed peer fails with EPIPE, to a half-closed one works.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include "zdtm.h"

static const char *const stream_words[] = { "bytes a child wrote before it ended", NULL };
static const char *const packets[] = { "first", "a second, longer message", "3", NULL };
static const char *const none[] = { NULL };
static const char *const half_words[] = { "last words", NULL };

struct end {
	const char *what;
	int type;
	int fd;
	int peer;			/* the half-closed peer, -1: closed */
	const char *const *queued;	/* what the peer wrote */
};

static void write_all(int fd, const char *const *msgs)
{
	for (; *msgs; msgs++)
		zdtm_check(send(fd, *msgs, strlen(*msgs), MSG_NOSIGNAL) == (ssize_t)strlen(*msgs),
			   "send: %m");
}

/* A child writes to its end and ends: its end is closed with it. */
static void peer_writes_and_ends(struct end *e)
{
	int sv[2];
	pid_t child;

	zdtm_check(socketpair(AF_UNIX, e->type, 0, sv) == 0, "socketpair: %m");
	child = fork();
	zdtm_check(child >= 0, "fork: %m");
	if (child == 0) {
		close(sv[0]);
		write_all(sv[1], e->queued);
		_exit(0);
	}
	close(sv[1]);
	zdtm_check(waitpid(child, NULL, 0) == child, "waitpid: %m");
	e->fd = sv[0];
	e->peer = -1;
}

/* The peer writes, shuts its end down for writing, and stays open. */
static void peer_shuts_down(struct end *e)
{
	int sv[2];

	zdtm_check(socketpair(AF_UNIX, e->type, 0, sv) == 0, "socketpair: %m");
	write_all(sv[1], e->queued);
	zdtm_check(shutdown(sv[1], SHUT_WR) == 0, "shutdown: %m");
	e->fd = sv[0];
	e->peer = sv[1];
}

/* What was queued, in order (seqpacket: one message per recv), then EOF. */
static uint64_t read_queue(const struct end *e, uint64_t hash)
{
	char buf[256], want[256] = "";
	size_t have = 0, len;
	ssize_t n;

	for (const char *const *m = e->queued; *m; m++)
		strcat(want, *m);
	len = strlen(want);
	if (e->type == SOCK_SEQPACKET) {
		for (const char *const *m = e->queued; *m; m++) {
			n = recv(e->fd, buf, sizeof(buf), MSG_DONTWAIT);
			zdtm_check(n == (ssize_t)strlen(*m) && !memcmp(buf, *m, n),
				   "%s: message %ld: %zd bytes (%m), expected \"%s\"", e->what,
				   (long)(m - e->queued), n, *m);
		}
		have = len;
	}
	while (have < len) {
		n = recv(e->fd, buf + have, sizeof(buf) - have, MSG_DONTWAIT);
		zdtm_check(n > 0, "%s: %zu of %zu queued bytes, then %zd (%m)", e->what, have, len, n);
		have += n;
	}
	zdtm_check(e->type == SOCK_SEQPACKET || !memcmp(buf, want, len),
		   "%s: queued bytes differ: \"%.*s\"", e->what, (int)len, buf);
	n = recv(e->fd, buf, sizeof(buf), MSG_DONTWAIT);
	zdtm_check(n == 0, "%s: %zd after the queued bytes, expected EOF (0): %m", e->what, n);
	for (size_t i = 0; i < len; i++)
		hash = zdtm_mix(hash, (unsigned char)want[i]);
	return hash;
}

static void hung_up(const struct end *e)
{
	struct pollfd p = { .fd = e->fd, .events = POLLIN | POLLOUT | POLLRDHUP };

	zdtm_check(poll(&p, 1, 0) == 1, "%s: poll: %m", e->what);
	zdtm_check((p.revents & POLLRDHUP) && !!(p.revents & POLLHUP) == (e->peer < 0),
		   "%s: poll says %#x", e->what, p.revents);
}

static void check_closed_peer(const struct end *e)
{
	zdtm_check(send(e->fd, "x", 1, MSG_NOSIGNAL) == -1 && errno == EPIPE,
		   "%s: a write to a closed peer did not fail with EPIPE: %m", e->what);
}

/* We may still write to it, it may not write to us. */
static void check_half_closed_peer(const struct end *e)
{
	char buf[32];

	zdtm_check(send(e->fd, "back", 4, MSG_NOSIGNAL) == 4, "%s: a write to a peer that "
		   "only shut down writing failed: %m", e->what);
	zdtm_check(recv(e->peer, buf, sizeof(buf), MSG_DONTWAIT) == 4 && !memcmp(buf, "back", 4),
		   "%s: the peer did not read what we wrote: %m", e->what);
	zdtm_check(send(e->peer, "x", 1, MSG_NOSIGNAL) == -1 && errno == EPIPE,
		   "%s: the peer's write did not fail with EPIPE: %m", e->what);
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	uint64_t hash = 0;
	struct end ends[] = {
		{ "stream, closed peer, bytes queued", SOCK_STREAM, -1, -1, stream_words },
		{ "seqpacket, closed peer, messages queued", SOCK_SEQPACKET, -1, -1, packets },
		{ "stream, closed peer, nothing queued", SOCK_STREAM, -1, -1, none },
		{ "seqpacket, closed peer, nothing queued", SOCK_SEQPACKET, -1, -1, none },
		{ "stream, peer shut down writing", SOCK_STREAM, -1, 0, half_words },
		{ "seqpacket, peer shut down writing", SOCK_SEQPACKET, -1, 0, packets },
	};
	const int nends = sizeof(ends) / sizeof(ends[0]);

	zdtm_args(argc, argv, &steps, &pace);
	signal(SIGPIPE, SIG_IGN);
	for (int i = 0; i < nends; i++) {
		if (ends[i].peer < 0) {
			peer_writes_and_ends(&ends[i]);
			continue;
		}
		peer_shuts_down(&ends[i]);
	}
	printf("READY\n");
	fflush(stdout);
	hash = zdtm_steps_hash(hash, steps, pace);
	zdtm_hold();
	for (int i = 0; i < nends; i++) {
		hung_up(&ends[i]);
		hash = read_queue(&ends[i], hash);
		if (ends[i].peer < 0)
			check_closed_peer(&ends[i]);
		else
			check_half_closed_peer(&ends[i]);
	}
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
