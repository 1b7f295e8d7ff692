/*
 * TCP connections of the program that are no longer ESTABLISHED:
 *   half:   one end shut down writing after sending bytes (its peer in
 *           CLOSE_WAIT, the bytes and EOF queued); the other direction
 *           still open;
 *   closed: one end sent bytes and closed (its peer reads them, then
 *           EOF; what the peer writes ends in a reset);
 *   both:   each end sent bytes and shut down writing (both reads end in
 *           EOF after the bytes, both writes fail with EPIPE).
 * At the end each end must see exactly that.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include "zdtm.h"

/* A connection on loopback: *a connected, *b accepted. */
static void tcp_pair(int *a, int *b)
{
	struct sockaddr_in at = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(at);
	int l = socket(AF_INET, SOCK_STREAM, 0);

	zdtm_check(l >= 0 && bind(l, (struct sockaddr *)&at, len) == 0 && listen(l, 1) == 0 &&
		   getsockname(l, (struct sockaddr *)&at, &len) == 0, "listener");
	*a = socket(AF_INET, SOCK_STREAM, 0);
	zdtm_check(connect(*a, (struct sockaddr *)&at, len) == 0, "connect");
	*b = accept(l, NULL, NULL);
	zdtm_check(*b >= 0, "accept");
	close(l);
}

/* What fd has queued is exactly `want`, then EOF. */
static void bytes_then_eof(int fd, const char *want, const char *what)
{
	char buf[128];
	size_t len = strlen(want);
	ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);

	zdtm_check(n == (ssize_t)len && !memcmp(buf, want, len), "%s: read %zd bytes (%s), want "
		   "\"%s\"", what, n, n < 0 ? strerror(errno) : "", want);
	n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
	zdtm_check(n == 0, "%s: no EOF after the bytes (%zd, %s)", what, n,
		   n < 0 ? strerror(errno) : "more bytes");
}

static void write_fails(int fd, int err, const char *what)
{
	zdtm_check(send(fd, "x", 1, MSG_NOSIGNAL) < 0 && errno == err, "%s: a write did not fail "
		   "with %s: %s", what, strerror(err), strerror(errno));
}

/* Writes to a peer that closed: the first goes out, the peer answers
 * with a reset, and a later one fails. */
static void writes_end_in_reset(int fd, const char *what)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	zdtm_check(send(fd, "x", 1, MSG_NOSIGNAL) == 1, "%s: the first write after EOF: %s", what,
		   strerror(errno));
	zdtm_check(poll(&p, 1, 10000) == 1 && (p.revents & (POLLERR | POLLHUP)), "%s: no reset "
		   "from the closed peer", what);
	zdtm_check(send(fd, "x", 1, MSG_NOSIGNAL) < 0 && (errno == ECONNRESET || errno == EPIPE),
		   "%s: a write after the reset: %s", what, strerror(errno));
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	int half_a, half_b, closed_a, closed_b, both_a, both_b;
	uint64_t hash = 0;
	char buf[16];

	zdtm_args(argc, argv, &steps, &pace);
	tcp_pair(&half_a, &half_b);
	zdtm_check(write(half_a, "half closed", 11) == 11 && shutdown(half_a, SHUT_WR) == 0,
		   "half: shutdown");
	tcp_pair(&closed_a, &closed_b);
	zdtm_check(write(closed_a, "closed after these", 18) == 18 && close(closed_a) == 0,
		   "closed: close");
	tcp_pair(&both_a, &both_b);
	zdtm_check(write(both_a, "from a", 6) == 6 && write(both_b, "from b", 6) == 6 &&
		   shutdown(both_a, SHUT_WR) == 0 && shutdown(both_b, SHUT_WR) == 0,
		   "both: shutdown");

	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	zdtm_hold();

	bytes_then_eof(half_b, "half closed", "half, the reading end");
	zdtm_check(write(half_b, "reply", 5) == 5 && recv(half_a, buf, sizeof(buf), 0) == 5 &&
		   !memcmp(buf, "reply", 5), "half: the other direction still carries bytes");
	write_fails(half_a, EPIPE, "half, the end shut down");
	bytes_then_eof(closed_b, "closed after these", "closed");
	writes_end_in_reset(closed_b, "closed");
	bytes_then_eof(both_a, "from b", "both, first end");
	bytes_then_eof(both_b, "from a", "both, second end");
	write_fails(both_a, EPIPE, "both, first end");
	write_fails(both_b, EPIPE, "both, second end");
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
