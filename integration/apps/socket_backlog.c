/*
 * Connections still in a listener's backlog: two clients of the program
 * connect to its TCP listener (one sends bytes, one sends nothing), a
 * third to its Unix listener with bytes, and nobody accept()s them until
 * the end.  Then the listeners are ready (poll), accept() hands them out
 * in the order they came, each with the bytes its client sent, and each
 * carries bytes both ways.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include "zdtm.h"

static unsigned short port_of(int fd, int peer)
{
	struct sockaddr_in a;
	socklen_t len = sizeof(a);

	memset(&a, 0, sizeof(a));
	if ((peer ? getpeername(fd, (struct sockaddr *)&a, &len) :
		    getsockname(fd, (struct sockaddr *)&a, &len)) != 0)
		return 0;
	return ntohs(a.sin_port);
}

static int readable(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

/* The next accepted connection: from client, with `sent` queued. */
static void accept_one(int listener, int client, const char *sent, int tcp, const char *what)
{
	char buf[64];
	size_t len = strlen(sent);
	int s;

	zdtm_check(readable(listener), "%s: the listener is not ready to accept", what);
	s = accept(listener, NULL, NULL);
	zdtm_check(s >= 0, "%s: accept: %s", what, strerror(errno));
	if (tcp)
		zdtm_check(port_of(s, 1) == port_of(client, 0), "%s: accepted the connection of port "
			   "%u, expected %u", what, port_of(s, 1), port_of(client, 0));
	if (len)
		zdtm_check(recv(s, buf, sizeof(buf), MSG_DONTWAIT) == (ssize_t)len &&
			   !memcmp(buf, sent, len), "%s: the bytes sent before the accept", what);
	zdtm_check(recv(s, buf, sizeof(buf), MSG_DONTWAIT) < 0 && errno == EAGAIN,
		   "%s: more bytes than the client sent", what);
	zdtm_check(write(client, "more", 4) == 4 && read(s, buf, 4) == 4 && !memcmp(buf, "more", 4) &&
		   write(s, "back", 4) == 4 && read(client, buf, 4) == 4 && !memcmp(buf, "back", 4),
		   "%s: bytes both ways after the accept", what);
	close(s);
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct sockaddr_un u = { .sun_family = AF_UNIX };
	socklen_t len = sizeof(a);
	int listener, ulistener, talker, silent, utalker;
	uint64_t hash = 0;

	zdtm_args(argc, argv, &steps, &pace);
	listener = socket(AF_INET, SOCK_STREAM, 0);
	/* its connections' TIME_WAIT must not hold a second restart's bind */
	zdtm_check(setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &(int){ 1 }, sizeof(int)) == 0 &&
		   bind(listener, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(listener, 8) == 0 &&
		   getsockname(listener, (struct sockaddr *)&a, &len) == 0, "TCP listener");
	talker = socket(AF_INET, SOCK_STREAM, 0);
	zdtm_check(connect(talker, (struct sockaddr *)&a, sizeof(a)) == 0 &&
		   write(talker, "sent before the accept", 22) == 22, "the first client");
	silent = socket(AF_INET, SOCK_STREAM, 0);
	zdtm_check(connect(silent, (struct sockaddr *)&a, sizeof(a)) == 0, "the second client");

	/* abstract: nothing to clean up */
	snprintf(u.sun_path + 1, sizeof(u.sun_path) - 1, "socket_backlog-%d", getpid());
	len = sizeof(sa_family_t) + 1 + strlen(u.sun_path + 1);
	ulistener = socket(AF_UNIX, SOCK_STREAM, 0);
	zdtm_check(bind(ulistener, (struct sockaddr *)&u, len) == 0 && listen(ulistener, 8) == 0,
		   "Unix listener: %s", strerror(errno));
	utalker = socket(AF_UNIX, SOCK_STREAM, 0);
	zdtm_check(connect(utalker, (struct sockaddr *)&u, len) == 0 &&
		   write(utalker, "unix bytes", 10) == 10, "the Unix client");

	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	zdtm_hold();

	accept_one(listener, talker, "sent before the accept", 1, "the first TCP connection");
	accept_one(listener, silent, "", 1, "the second TCP connection");
	zdtm_check(!readable(listener), "the TCP listener has a connection nobody made");
	accept_one(ulistener, utalker, "unix bytes", 0, "the Unix connection");
	zdtm_check(!readable(ulistener), "the Unix listener has a connection nobody made");
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
