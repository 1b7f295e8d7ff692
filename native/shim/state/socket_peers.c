/*
 * Which connected sockets lead to a process of the job, and which lead
 * outside it.  At SUSPEND every process publishes each socket end and
 * listener it has under a name the other end can compute ("sock:..." keys
 * of the coordinator); after SUSPEND, when the whole job has published,
 * an end whose peer's name is missing leads outside.  The user is told which fd and
 * peer: a restart connects such a socket again, but the process at the
 * other end keeps no state of ours.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include "shim.h"

#define KEY_MAX 160
#define LEFT_OUTSIDE_MAX 8

/* Connections a plugin keeps outside the job on purpose (ckpt_plugin.h):
 * set from any thread, read by the checkpoint thread while parked. */
static volatile int left_outside[LEFT_OUTSIDE_MAX] = { -1, -1, -1, -1, -1, -1, -1, -1 };

void ckpt_fd_left_outside(int fd, int left)
{
	for (int i = 0; i < LEFT_OUTSIDE_MAX; i++)
		if (left_outside[i] == (left ? -1 : fd)) {
			left_outside[i] = left ? fd : -1;
			return;
		}
}

int fd_left_outside(int fd)
{
	for (int i = 0; i < LEFT_OUTSIDE_MAX; i++)
		if (fd >= 0 && left_outside[i] == fd)
			return 1;
	return 0;
}

struct sock_end {
	char mine[KEY_MAX];		/* this end's name, or "" */
	char theirs[KEY_MAX];		/* the peer end's name */
	char listener[KEY_MAX];		/* the name of the job's listener the peer
					 * would be accepted from, or "" */
	char peer_text[120];		/* the peer, for the user */
	int datagram;			/* UDP: "connected" only names a default peer */
};

static const char *inet_text(const struct sockaddr_storage *ss, char *buf, size_t size)
{
	const struct sockaddr_in *in = (const void *)ss;
	const struct sockaddr_in6 *in6 = (const void *)ss;
	char host[INET6_ADDRSTRLEN] = "?";

	if (ss->ss_family == AF_INET)
		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
	else
		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
	snprintf(buf, size, ss->ss_family == AF_INET6 ? "[%s]:%u" : "%s:%u", host,
		 ntohs(in->sin_port));
	return buf;
}

static int is_loopback(const struct sockaddr_storage *ss)
{
	const struct sockaddr_in *in = (const void *)ss;
	const struct sockaddr_in6 *in6 = (const void *)ss;

	if (ss->ss_family == AF_INET)
		return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
	return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
}

/* ::ffff:a.b.c.d as a.b.c.d: an IPv6 listener's end of an IPv4 connection
 * must name it as the IPv4 end does. */
static void unmap_v4(struct sockaddr_storage *ss)
{
	struct sockaddr_in6 in6 = *(struct sockaddr_in6 *)ss;
	struct sockaddr_in *in = (struct sockaddr_in *)ss;

	if (ss->ss_family != AF_INET6 || !IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr))
		return;
	memset(ss, 0, sizeof(*ss));
	in->sin_family = AF_INET;
	in->sin_port = in6.sin6_port;
	memcpy(&in->sin_addr, &in6.sin6_addr.s6_addr[12], 4);
}

static unsigned inet_port(const struct sockaddr_storage *ss)
{
	return ntohs(((const struct sockaddr_in *)ss)->sin_port);	/* same place in IPv6 */
}

static int same_host(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	const struct sockaddr_in *a4 = (const void *)a, *b4 = (const void *)b;
	const struct sockaddr_in6 *a6 = (const void *)a, *b6 = (const void *)b;

	if (is_loopback(b))
		return 1;
	if (a->ss_family != b->ss_family)
		return 0;
	return a->ss_family == AF_INET ? a4->sin_addr.s_addr == b4->sin_addr.s_addr :
	       !memcmp(&a6->sin6_addr, &b6->sin6_addr, sizeof(a6->sin6_addr));
}

/*
 * An IP connection is named by its two addresses (and the host, when
 * they are loopback ones, which every host has).  A TCP listener of the
 * job is named by its port on its host: a connection it has not accepted
 * yet has no other end in any process.
 */
static int inet_end(int s, int type, struct sock_end *e)
{
	struct sockaddr_storage local, peer;
	socklen_t llen = sizeof(local), plen = sizeof(peer);
	char l[64], p[64];
	const char *proto = type == SOCK_STREAM ? "tcp" : "udp";
	const char *host = "";
	int listening = 0;
	socklen_t olen = sizeof(listening);

	if (net_real_getsockname(s, (struct sockaddr *)&local, &llen))
		return ENOTCONN;
	if (type == SOCK_STREAM && !getsockopt(s, SOL_SOCKET, SO_ACCEPTCONN, &listening, &olen) &&
	    listening) {
		snprintf(e->mine, sizeof(e->mine), "sock:%s:tcplisten:%u", shim_hostname(),
			 inet_port(&local));
		return ENOTCONN;
	}
	if (net_real_getpeername(s, (struct sockaddr *)&peer, &plen))
		return ENOTCONN;
	unmap_v4(&local);
	unmap_v4(&peer);
	if (is_loopback(&peer))
		host = shim_hostname();
	inet_text(&local, l, sizeof(l));
	inet_text(&peer, p, sizeof(p));
	snprintf(e->mine, sizeof(e->mine), "sock:%s:%s:%s>%s", host, proto, l, p);
	snprintf(e->theirs, sizeof(e->theirs), "sock:%s:%s:%s>%s", host, proto, p, l);
	if (type == SOCK_STREAM && same_host(&local, &peer))
		snprintf(e->listener, sizeof(e->listener), "sock:%s:tcplisten:%u", shim_hostname(),
			 inet_port(&peer));
	snprintf(e->peer_text, sizeof(e->peer_text), "%s %s", type == SOCK_STREAM ? "TCP" : "UDP", p);
	return 0;
}

/* A Unix address as text: a file name, or @name for an abstract one
 * (which may hold any byte: shown as '?'). */
static int unix_name(const struct sockaddr_un *a, socklen_t len, char *buf, size_t size)
{
	int abstract = a->sun_path[0] == '\0';
	int name_len = len - sizeof(sa_family_t) - 1;	/* the NUL, or the @ */

	if (len <= sizeof(sa_family_t))
		return ENOENT;
	snprintf(buf, size, "%s%.*s", abstract ? "@" : "", name_len, a->sun_path + abstract);
	for (char *p = buf; *p; p++)
		if ((unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e)
			*p = '?';
	return 0;
}

/* Keys hold no spaces: a Unix name goes in as its hash. */
static void unix_listener_key(const char *name, char *key, size_t size)
{
	snprintf(key, size, "sock:%s:unixlisten:%016llx", shim_hostname(),
		 (unsigned long long)shim_xxh3(name, strlen(name)));
}

/*
 * A Unix socket is named by its inode, connected or not (a datagram socket
 * bound to a name receives from sockets connected to it); sock_diag gives
 * the peer's.  A connection its listener has not accepted yet has no peer
 * inode: the listener's address names its listener.
 */
static int unix_end(int s, uint64_t ino, struct sock_end *e)
{
	struct sockaddr_un a;
	socklen_t len = sizeof(a);
	uint64_t peer_ino = socket_unix_peer(ino);
	char name[sizeof(a.sun_path) + 2] = "";
	int listening = 0;
	socklen_t olen = sizeof(listening);

	snprintf(e->mine, sizeof(e->mine), "sock:%s:unix:%llu", shim_hostname(),
		 (unsigned long long)ino);
	if (!getsockopt(s, SOL_SOCKET, SO_ACCEPTCONN, &listening, &olen) && listening) {
		if (net_real_getsockname(s, (struct sockaddr *)&a, &len) == 0 &&
		    !unix_name(&a, len, name, sizeof(name)))
			unix_listener_key(name, e->mine, sizeof(e->mine));
		return ENOTCONN;
	}
	if (net_real_getpeername(s, (struct sockaddr *)&a, &len) == 0)
		unix_name(&a, len, name, sizeof(name));
	if (!peer_ino && !name[0])
		return ENOTCONN;
	if (peer_ino)
		snprintf(e->theirs, sizeof(e->theirs), "sock:%s:unix:%llu", shim_hostname(),
			 (unsigned long long)peer_ino);
	if (name[0]) {
		unix_listener_key(name, e->listener, sizeof(e->listener));
		snprintf(e->peer_text, sizeof(e->peer_text), "Unix socket %s", name);
	} else {
		snprintf(e->peer_text, sizeof(e->peer_text), "Unix socket (inode %llu)",
			 (unsigned long long)peer_ino);
	}
	return 0;
}

/* 0 and e filled for a connected socket of the application; else errno
 * (e->mine may still name a listener or an unconnected Unix socket). */
static int describe_end(int fd, struct sock_end *e)
{
	struct stat st;
	int s = app_getfd(fd), domain = 0, type = 0, err = ENOTCONN;
	socklen_t len = sizeof(int);

	memset(e, 0, sizeof(*e));
	if (s < 0)
		return errno;
	if (fstat(s, &st) || getsockopt(s, SOL_SOCKET, SO_DOMAIN, &domain, &len))
		goto out;
	len = sizeof(int);
	getsockopt(s, SOL_SOCKET, SO_TYPE, &type, &len);
	if (domain == AF_UNIX)
		err = unix_end(s, st.st_ino, e);
	else if (domain == AF_INET || domain == AF_INET6)
		err = inet_end(s, type, e);
	e->datagram = type == SOCK_DGRAM;
out:
	close(s);
	return err;
}

/* SUSPEND: name every socket end and listener of this process. */
int socket_peers_publish(const int *socks, int n)
{
	char pid[16];

	snprintf(pid, sizeof(pid), "%d", getpid());
	for (int i = 0; i < n; i++) {
		struct sock_end e;
		int err;

		describe_end(socks[i], &e);
		err = e.mine[0] ? ckpt_kv_put(e.mine, pid) : 0;
		if (err)
			return err;
	}
	return 0;
}

static int name_known(const char *key)
{
	char owner[32];

	return key[0] && ckpt_kv_get(key, owner, sizeof(owner)) == 0;
}

/* The peer sent its FIN: nothing more comes from it, wherever it is (a
 * restart gives fd its bytes and EOF, native/restart/state/sockets.c). */
static int peer_finished(int fd)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);
	int s = app_getfd(fd), state = 0;

	if (s < 0)
		return 0;
	if (!getsockopt(s, IPPROTO_TCP, TCP_INFO, &ti, &len))
		state = ti.tcpi_state;
	close(s);
	return state == TCP_CLOSE_WAIT || state == TCP_LAST_ACK || state == TCP_CLOSING;
}

/*
 * After SUSPEND: where fd's peer is: PEER_IN_JOB, PEER_PENDING (a
 * connection a listener of the job has not accepted yet), PEER_OUTSIDE
 * (the user is told if report), or PEER_NONE (not connected).
 */
int socket_peer(int fd, int report)
{
	struct sock_end e;

	if (fd_left_outside(fd) || describe_end(fd, &e))
		return PEER_NONE;
	if (name_known(e.theirs))
		return PEER_IN_JOB;
	if (name_known(e.listener))
		return PEER_PENDING;
	/* a datagram socket holds no state of its peer's: connected again,
	 * it is as it was */
	if (report && !e.datagram && !peer_finished(fd))
		ckpt_warn("fd %d is connected outside the job, to %s: a restart connects it again, "
			  "but that peer's state is not part of the checkpoint", fd, e.peer_text);
	return PEER_OUTSIDE;
}

/* DRAIN: fd's end of a connection inside the job is to be flushed. */
int socket_end_ready(int fd)
{
	struct sock_end e;
	char key[KEY_MAX + 8];

	if (describe_end(fd, &e))
		return ENOTCONN;
	snprintf(key, sizeof(key), "sock:ready:%.*s", KEY_MAX - 5, e.mine + 5);
	return ckpt_kv_put(key, "1");
}

/* FLUSH: the peer's end is to be flushed too. */
int socket_peer_ready(int fd)
{
	struct sock_end e;
	char key[KEY_MAX + 8];

	if (describe_end(fd, &e))
		return 0;
	snprintf(key, sizeof(key), "sock:ready:%.*s", KEY_MAX - 5, e.theirs + 5);
	return name_known(key);
}
