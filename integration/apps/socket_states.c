/*
 * Sockets in the states programs leave them in besides "connected": TCP
 * and UDP sockets never bound, bound only, a UDP socket connected, a
 * listener, Unix datagram sockets with queued datagrams, and a stream pair half shut down (SHUT_WR) with
 * bytes still to read; sockets bound with IP_FREEBIND / IPV6_FREEBIND to
 * addresses no host has (documentation ranges), a listener among them.  At the end each must still be what it was: same
 * type and family, same local (and peer) address, listening or not, the
 * queued bytes, EOF after them; and usable (bind, listen, connect, send).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include "zdtm.h"

static int sockopt(int fd, int opt)
{
	int v = -1;
	socklen_t len = sizeof(v);

	zdtm_check(getsockopt(fd, SOL_SOCKET, opt, &v, &len) == 0, "getsockopt %d on fd %d: %s",
		   opt, fd, strerror(errno));
	return v;
}

static void is_socket(int fd, int domain, int type, int listening, const char *what)
{
	zdtm_check(sockopt(fd, SO_DOMAIN) == domain, "%s: domain %d", what, sockopt(fd, SO_DOMAIN));
	zdtm_check(sockopt(fd, SO_TYPE) == type, "%s: type %d", what, sockopt(fd, SO_TYPE));
	zdtm_check(sockopt(fd, SO_ACCEPTCONN) == listening, "%s: listening %d", what,
		   sockopt(fd, SO_ACCEPTCONN));
}

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

/* A socket bound, with IP(V6)_FREEBIND, to an address of a documentation
 * range (on no host); its port. */
static unsigned short bind_free(int fd, int domain)
{
	struct sockaddr_storage st;
	struct sockaddr_in *in = (struct sockaddr_in *)&st;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&st;
	socklen_t len;

	memset(&st, 0, sizeof(st));
	if (domain == AF_INET) {
		zdtm_check(setsockopt(fd, IPPROTO_IP, IP_FREEBIND, &(int){ 1 }, sizeof(int)) == 0,
			   "IP_FREEBIND: %m");
		in->sin_family = AF_INET;
		inet_pton(AF_INET, "198.51.100.7", &in->sin_addr);
		len = sizeof(*in);
	} else {
		zdtm_check(setsockopt(fd, IPPROTO_IPV6, IPV6_FREEBIND, &(int){ 1 }, sizeof(int)) == 0,
			   "IPV6_FREEBIND: %m");
		in6->sin6_family = AF_INET6;
		inet_pton(AF_INET6, "2001:db8::7", &in6->sin6_addr);
		len = sizeof(*in6);
	}
	zdtm_check(bind(fd, (struct sockaddr *)&st, len) == 0, "bind to an address not here: %m");
	zdtm_check(getsockname(fd, (struct sockaddr *)&st, &len) == 0, "getsockname: %m");
	return ntohs(domain == AF_INET ? in->sin_port : in6->sin6_port);
}

/* Still bound to that address and port, the option still set. */
static void is_bound_free(int fd, int domain, unsigned short port, const char *what)
{
	struct sockaddr_storage st;
	socklen_t len = sizeof(st);
	char text[64] = "?";
	int on = 0;
	socklen_t olen = sizeof(on);
	unsigned short got;

	zdtm_check(getsockname(fd, (struct sockaddr *)&st, &len) == 0, "%s: getsockname: %m", what);
	if (domain == AF_INET) {
		inet_ntop(AF_INET, &((struct sockaddr_in *)&st)->sin_addr, text, sizeof(text));
		got = ntohs(((struct sockaddr_in *)&st)->sin_port);
		getsockopt(fd, IPPROTO_IP, IP_FREEBIND, &on, &olen);
	} else {
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&st)->sin6_addr, text, sizeof(text));
		got = ntohs(((struct sockaddr_in6 *)&st)->sin6_port);
		getsockopt(fd, IPPROTO_IPV6, IPV6_FREEBIND, &on, &olen);
	}
	zdtm_check(!strcmp(text, domain == AF_INET ? "198.51.100.7" : "2001:db8::7") &&
		   got == port && on == 1, "%s: bound to %s port %u (was %u), freebind %d", what,
		   text, got, port, on);
}

static struct sockaddr_in loopback(unsigned short port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	int tcp_fresh, tcp_bound, udp_fresh, udp_bound, udp_conn, listener, dgram[2], half[2];
	int unix_fresh, unix_dgram_fresh, udp_shut, seqpacket[2], mapped_client, mapped_server;
	int udp_pair[2], free_udp, free_listener, free_udp6;
	unsigned short bound_port, udp_port, conn_port, listen_port, free_ports[3];
	struct sockaddr_in a;
	char buf[64];
	uint64_t hash = 0;

	zdtm_args(argc, argv, &steps, &pace);
	tcp_fresh = socket(AF_INET, SOCK_STREAM, 0);
	tcp_bound = socket(AF_INET, SOCK_STREAM, 0);
	a = loopback(0);
	zdtm_check(bind(tcp_bound, (struct sockaddr *)&a, sizeof(a)) == 0, "bind tcp");
	bound_port = port_of(tcp_bound, 0);
	udp_fresh = socket(AF_INET, SOCK_DGRAM, 0);
	udp_bound = socket(AF_INET, SOCK_DGRAM, 0);
	zdtm_check(bind(udp_bound, (struct sockaddr *)&a, sizeof(a)) == 0, "bind udp");
	udp_port = port_of(udp_bound, 0);
	udp_conn = socket(AF_INET, SOCK_DGRAM, 0);
	a = loopback(udp_port);
	zdtm_check(connect(udp_conn, (struct sockaddr *)&a, sizeof(a)) == 0, "connect udp");
	conn_port = port_of(udp_conn, 0);
	zdtm_check(send(udp_conn, "queued", 6, 0) == 6, "send udp");

	listener = socket(AF_INET, SOCK_STREAM, 0);
	/* its connection's TIME_WAIT must not hold a second restart's bind */
	zdtm_check(setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &(int){ 1 }, sizeof(int)) == 0,
		   "SO_REUSEADDR");
	a = loopback(0);
	zdtm_check(bind(listener, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(listener, 4) == 0,
		   "listen");
	listen_port = port_of(listener, 0);

	zdtm_check(socketpair(AF_UNIX, SOCK_DGRAM, 0, dgram) == 0, "dgram pair");
	zdtm_check(send(dgram[0], "one", 3, 0) == 3 && send(dgram[0], "two!", 4, 0) == 4, "dgrams");
	zdtm_check(socketpair(AF_UNIX, SOCK_STREAM, 0, half) == 0, "stream pair");
	zdtm_check(write(half[0], "last words", 10) == 10 && shutdown(half[0], SHUT_WR) == 0,
		   "shutdown");

	zdtm_check(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, seqpacket) == 0 &&
		   send(seqpacket[0], "rec1", 4, 0) == 4 && send(seqpacket[0], "record2", 7, 0) == 7,
		   "seqpacket pair");
	{
		/* an IPv6 listener on ::, an IPv4 client: the accepted end's
		 * addresses are IPv4-mapped (::ffff:127.0.0.1) */
		int v6 = socket(AF_INET6, SOCK_STREAM, 0);
		struct sockaddr_in6 any6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT };
		socklen_t l6 = sizeof(any6);

		zdtm_check(v6 >= 0 && bind(v6, (struct sockaddr *)&any6, sizeof(any6)) == 0 &&
			   listen(v6, 1) == 0 && getsockname(v6, (struct sockaddr *)&any6, &l6) == 0,
			   "IPv6 listener");
		mapped_client = socket(AF_INET, SOCK_STREAM, 0);
		a = loopback(ntohs(any6.sin6_port));
		zdtm_check(connect(mapped_client, (struct sockaddr *)&a, sizeof(a)) == 0, "connect v4 to v6");
		mapped_server = accept(v6, NULL, NULL);
		zdtm_check(mapped_server >= 0 && write(mapped_client, "mapped", 6) == 6, "accept mapped");
		close(v6);
	}
	for (int i = 0; i < 2; i++) {	/* two UDP sockets connected to each other */
		udp_pair[i] = socket(AF_INET, SOCK_DGRAM, 0);
		a = loopback(0);
		zdtm_check(bind(udp_pair[i], (struct sockaddr *)&a, sizeof(a)) == 0, "bind udp pair");
	}
	for (int i = 0; i < 2; i++) {
		a = loopback(port_of(udp_pair[1 - i], 0));
		zdtm_check(connect(udp_pair[i], (struct sockaddr *)&a, sizeof(a)) == 0, "connect udp pair");
	}
	zdtm_check(send(udp_pair[0], "ping", 4, 0) == 4, "udp pair send");
	unix_fresh = socket(AF_UNIX, SOCK_STREAM, 0);
	unix_dgram_fresh = socket(AF_UNIX, SOCK_DGRAM, 0);
	udp_shut = socket(AF_INET, SOCK_DGRAM, 0);
	a = loopback(udp_port);
	zdtm_check(connect(udp_shut, (struct sockaddr *)&a, sizeof(a)) == 0 &&
		   shutdown(udp_shut, SHUT_RDWR) == 0, "shut down a connected udp socket");

	free_udp = socket(AF_INET, SOCK_DGRAM, 0);
	free_ports[0] = bind_free(free_udp, AF_INET);
	free_listener = socket(AF_INET, SOCK_STREAM, 0);
	free_ports[1] = bind_free(free_listener, AF_INET);
	zdtm_check(listen(free_listener, 4) == 0, "listen on an address not here: %m");
	free_udp6 = socket(AF_INET6, SOCK_DGRAM, 0);
	free_ports[2] = bind_free(free_udp6, AF_INET6);

	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	zdtm_hold();

	is_socket(tcp_fresh, AF_INET, SOCK_STREAM, 0, "unbound tcp");
	zdtm_check(port_of(tcp_fresh, 0) == 0, "unbound tcp has port %u", port_of(tcp_fresh, 0));
	is_socket(tcp_bound, AF_INET, SOCK_STREAM, 0, "bound tcp");
	zdtm_check(port_of(tcp_bound, 0) == bound_port, "bound tcp port %u, was %u",
		   port_of(tcp_bound, 0), bound_port);
	is_socket(udp_fresh, AF_INET, SOCK_DGRAM, 0, "unbound udp");
	is_socket(udp_bound, AF_INET, SOCK_DGRAM, 0, "bound udp");
	zdtm_check(port_of(udp_bound, 0) == udp_port, "bound udp port");
	is_socket(udp_conn, AF_INET, SOCK_DGRAM, 0, "connected udp");
	zdtm_check(port_of(udp_conn, 0) == conn_port && port_of(udp_conn, 1) == udp_port,
		   "connected udp ports %u->%u", port_of(udp_conn, 0), port_of(udp_conn, 1));
	zdtm_check(recv(udp_bound, buf, sizeof(buf), MSG_DONTWAIT) == 6 && !memcmp(buf, "queued", 6),
		   "the queued UDP datagram");
	is_socket(listener, AF_INET, SOCK_STREAM, 1, "listener");
	zdtm_check(port_of(listener, 0) == listen_port, "listener port");
	{
		int client = socket(AF_INET, SOCK_STREAM, 0), accepted;

		a = loopback(listen_port);
		zdtm_check(connect(client, (struct sockaddr *)&a, sizeof(a)) == 0, "connect");
		accepted = accept(listener, NULL, NULL);
		zdtm_check(accepted >= 0 && write(client, "later", 5) == 5 &&
			   read(accepted, buf, 5) == 5 && !memcmp(buf, "later", 5),
			   "the listener accepts and carries bytes");
	}
	is_socket(dgram[1], AF_UNIX, SOCK_DGRAM, 0, "unix datagram");
	zdtm_check(recv(dgram[1], buf, sizeof(buf), MSG_DONTWAIT) == 3 && !memcmp(buf, "one", 3) &&
		   recv(dgram[1], buf, sizeof(buf), MSG_DONTWAIT) == 4 && !memcmp(buf, "two!", 4),
		   "the queued unix datagrams, one by one");
	zdtm_check(read(half[1], buf, sizeof(buf)) == 10 && !memcmp(buf, "last words", 10),
		   "bytes before the shutdown");
	zdtm_check(read(half[1], buf, sizeof(buf)) == 0, "EOF after a shutdown(SHUT_WR)");
	zdtm_check(write(half[1], "back", 4) == 4 && read(half[0], buf, 4) == 4,
		   "the other direction of a half-shut pair");

	is_socket(seqpacket[1], AF_UNIX, SOCK_SEQPACKET, 0, "seqpacket");
	zdtm_check(recv(seqpacket[1], buf, sizeof(buf), MSG_DONTWAIT) == 4 &&
		   recv(seqpacket[1], buf, sizeof(buf), MSG_DONTWAIT) == 7 && !memcmp(buf, "record2", 7),
		   "the queued seqpacket records, with their bounds");
	zdtm_check(read(mapped_server, buf, 6) == 6 && !memcmp(buf, "mapped", 6) &&
		   write(mapped_server, "back", 4) == 4 && read(mapped_client, buf, 4) == 4,
		   "a connection over an IPv4-mapped IPv6 address");
	is_socket(udp_pair[0], AF_INET, SOCK_DGRAM, 0, "udp pair");
	zdtm_check(recv(udp_pair[1], buf, sizeof(buf), MSG_DONTWAIT) == 4 && !memcmp(buf, "ping", 4) &&
		   send(udp_pair[1], "pong", 4, 0) == 4 && recv(udp_pair[0], buf, 4, 0) == 4,
		   "two UDP sockets connected to each other");
	is_socket(unix_fresh, AF_UNIX, SOCK_STREAM, 0, "unbound unix stream");
	is_socket(unix_dgram_fresh, AF_UNIX, SOCK_DGRAM, 0, "unbound unix datagram");
	is_socket(udp_shut, AF_INET, SOCK_DGRAM, 0, "shut down udp");
	zdtm_check(port_of(udp_shut, 1) == udp_port, "shut down udp keeps its peer");

	is_socket(free_udp, AF_INET, SOCK_DGRAM, 0, "freebind udp");
	is_bound_free(free_udp, AF_INET, free_ports[0], "freebind udp");
	is_socket(free_listener, AF_INET, SOCK_STREAM, 1, "freebind listener");
	is_bound_free(free_listener, AF_INET, free_ports[1], "freebind listener");
	is_socket(free_udp6, AF_INET6, SOCK_DGRAM, 0, "freebind udp6");
	is_bound_free(free_udp6, AF_INET6, free_ports[2], "freebind udp6");

	/* still usable: the unbound ones bind, listen and connect */
	a = loopback(0);
	zdtm_check(bind(tcp_fresh, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(tcp_fresh, 1) == 0,
		   "the unbound tcp socket binds and listens: %s", strerror(errno));
	zdtm_check(listen(tcp_bound, 1) == 0, "the bound tcp socket listens");
	a = loopback(port_of(tcp_fresh, 0));
	zdtm_check(connect(udp_fresh, (struct sockaddr *)&a, sizeof(a)) == 0, "the unbound udp connects");
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
