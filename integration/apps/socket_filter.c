/*
 * Classic BPF socket filters (SO_ATTACH_FILTER): a UDP socket and a Unix
 * datagram socket each drop the datagrams that start with 'x'; the Unix
 * one's filter is locked (SO_LOCK_FILTER).  Datagrams sent before the
 * checkpoints and after: only the others arrive, in order; the filters
 * read back as attached; the lock still holds.
 */
#include <arpa/inet.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include "zdtm.h"

/* A = the first payload byte (at `offset`: UDP's header comes first);
 * 'x': drop, else keep all. */
static void attach(int s, unsigned offset)
{
	struct sock_filter code[] = {
		BPF_STMT(BPF_LD | BPF_B | BPF_ABS, offset),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 'x', 0, 1),
		BPF_STMT(BPF_RET | BPF_K, 0),
		BPF_STMT(BPF_RET | BPF_K, 0xffff),
	};
	struct sock_fprog prog = { sizeof(code) / sizeof(code[0]), code };

	zdtm_check(setsockopt(s, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof(prog)) == 0,
		   "SO_ATTACH_FILTER: %s", strerror(errno));
}

static void send_all(int s, const char *const *msgs)
{
	for (; *msgs; msgs++)
		zdtm_check(send(s, *msgs, strlen(*msgs), 0) == (ssize_t)strlen(*msgs), "send %s: %s",
			   *msgs, strerror(errno));
}

/* Exactly these datagrams are queued, in order. */
static void received(int s, const char *const *want, const char *what)
{
	char buf[64];
	ssize_t n;

	for (; *want; want++) {
		n = recv(s, buf, sizeof(buf), MSG_DONTWAIT);
		zdtm_check(n == (ssize_t)strlen(*want) && !memcmp(buf, *want, n),
			   "%s: got %.*s, want %s", what, n > 0 ? (int)n : 0, buf, *want);
	}
	n = recv(s, buf, sizeof(buf), MSG_DONTWAIT);
	zdtm_check(n < 0 && errno == EAGAIN, "%s: a datagram the filter should have dropped: %.*s",
		   what, n > 0 ? (int)n : 0, buf);
}

static int filter_length(int s)
{
	socklen_t n = 0;

	return getsockopt(s, SOL_SOCKET, SO_GET_FILTER, NULL, &n) ? -1 : (int)n;
}

int main(int argc, char **argv)
{
	static const char *const before[] = { "keep one", "xdrop", "keep two", NULL };
	static const char *const after[] = { "xdrop again", "keep three", NULL };
	static const char *const all[] = { "keep one", "keep two", "keep three", NULL };
	long steps = 100, pace = 10;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int udp_in, udp_out, pair[2], locked = 0;
	uint64_t hash = 0;

	zdtm_args(argc, argv, &steps, &pace);
	udp_in = socket(AF_INET, SOCK_DGRAM, 0);
	udp_out = socket(AF_INET, SOCK_DGRAM, 0);
	zdtm_check(bind(udp_in, (struct sockaddr *)&a, len) == 0 &&
		   getsockname(udp_in, (struct sockaddr *)&a, &len) == 0 &&
		   connect(udp_out, (struct sockaddr *)&a, len) == 0, "UDP sockets");
	attach(udp_in, 8);
	zdtm_check(socketpair(AF_UNIX, SOCK_DGRAM, 0, pair) == 0, "socketpair");
	attach(pair[1], 0);
	zdtm_check(setsockopt(pair[1], SOL_SOCKET, SO_LOCK_FILTER, &(int){ 1 }, sizeof(int)) == 0,
		   "SO_LOCK_FILTER: %s", strerror(errno));
	send_all(udp_out, before);
	send_all(pair[0], before);

	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	zdtm_hold();

	send_all(udp_out, after);
	send_all(pair[0], after);
	received(udp_in, all, "UDP");
	received(pair[1], all, "Unix datagrams");
	zdtm_check(filter_length(udp_in) == 4 && filter_length(pair[1]) == 4,
		   "the filters read back with %d and %d instructions", filter_length(udp_in),
		   filter_length(pair[1]));
	len = sizeof(locked);
	zdtm_check(getsockopt(pair[1], SOL_SOCKET, SO_LOCK_FILTER, &locked, &len) == 0 && locked == 1,
		   "the Unix socket's filter is no longer locked");
	zdtm_check(setsockopt(pair[1], SOL_SOCKET, SO_DETACH_FILTER, &(int){ 0 }, sizeof(int)) < 0 &&
		   errno == EPERM, "a locked filter could be detached");
	zdtm_check(setsockopt(udp_in, SOL_SOCKET, SO_DETACH_FILTER, &(int){ 0 }, sizeof(int)) == 0,
		   "the UDP filter cannot be detached: %s", strerror(errno));
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
