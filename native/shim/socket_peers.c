/*
 * Which connected sockets lead to a process of the job, and which lead
 * outside it.  At SUSPEND every process publishes each connected socket
 * end under a name the other end can compute ("sock:..." keys of the
 * coordinator); at DRAIN, when the whole job has published, an end whose
 * peer's name is missing leads outside.  The user is told which fd and
 * peer: a restart connects such a socket again, but the process at the
 * other end keeps no state of ours.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include "shim.h"

#define KEY_MAX 160

struct sock_end {
	char mine[KEY_MAX];		/* this end's name */
	char theirs[KEY_MAX];		/* the peer end's name */
	char peer_text[120];		/* the peer, for the user */
	int tcp;
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
	return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) || IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr);
}

/* An IP connection is named by its two addresses (and the host, when
 * they are loopback ones, which every host has). */
static int inet_end(int s, int type, struct sock_end *e)
{
	struct sockaddr_storage local, peer;
	socklen_t llen = sizeof(local), plen = sizeof(peer);
	char l[64], p[64];
	const char *proto = type == SOCK_STREAM ? "tcp" : "udp";
	const char *host = "";

	if (getsockname(s, (struct sockaddr *)&local, &llen) ||
	    getpeername(s, (struct sockaddr *)&peer, &plen))
		return ENOTCONN;
	if (is_loopback(&peer))
		host = shim_hostname();
	inet_text(&local, l, sizeof(l));
	inet_text(&peer, p, sizeof(p));
	snprintf(e->mine, sizeof(e->mine), "sock:%s:%s:%s>%s", host, proto, l, p);
	snprintf(e->theirs, sizeof(e->theirs), "sock:%s:%s:%s>%s", host, proto, p, l);
	snprintf(e->peer_text, sizeof(e->peer_text), "%s %s", type == SOCK_STREAM ? "TCP" : "UDP", p);
	e->tcp = type == SOCK_STREAM;
	return 0;
}

/* A Unix address as text: a file name, or @name for an abstract one. */
static int unix_name(const struct sockaddr_un *a, socklen_t len, char *buf, size_t size)
{
	int abstract = a->sun_path[0] == '\0';
	int name_len = len - sizeof(sa_family_t) - 1;	/* the NUL, or the @ */

	if (len <= sizeof(sa_family_t))
		return ENOENT;
	snprintf(buf, size, "%s%.*s", abstract ? "@" : "", name_len, a->sun_path + abstract);
	return 0;
}

/*
 * A Unix socket is named by its inode; sock_diag gives the peer's.  A
 * connection its listener has not accepted yet has no peer inode: it is
 * named by the listener's address, which a listener of the job names too.
 */
static int unix_end(int s, uint64_t ino, struct sock_end *e)
{
	struct sockaddr_un a;
	socklen_t len = sizeof(a);
	uint64_t peer_ino = socket_unix_peer(ino);
	char name[sizeof(a.sun_path) + 2] = "";

	if (getpeername(s, (struct sockaddr *)&a, &len) == 0)
		unix_name(&a, len, name, sizeof(name));
	if (!peer_ino && !name[0])
		return ENOTCONN;
	snprintf(e->mine, sizeof(e->mine), "sock:%s:unix:%llu", shim_hostname(),
		 (unsigned long long)ino);
	if (peer_ino)
		snprintf(e->theirs, sizeof(e->theirs), "sock:%s:unix:%llu", shim_hostname(),
			 (unsigned long long)peer_ino);
	else
		snprintf(e->theirs, sizeof(e->theirs), "sock:%s:unix:%s", shim_hostname(), name);
	if (name[0])
		snprintf(e->peer_text, sizeof(e->peer_text), "Unix socket %s", name);
	else
		snprintf(e->peer_text, sizeof(e->peer_text), "Unix socket (inode %llu)",
			 (unsigned long long)peer_ino);
	return 0;
}

/* The name under which a job's Unix listener is found, or "". */
static void unix_listener_key(int fd, char *key, size_t size)
{
	struct sockaddr_un a;
	socklen_t len = sizeof(a);
	char name[sizeof(a.sun_path) + 2];
	int s = app_getfd(fd), listening = 0;
	socklen_t olen = sizeof(listening);

	key[0] = '\0';
	if (s < 0)
		return;
	if (getsockname(s, (struct sockaddr *)&a, &len) == 0 && a.sun_family == AF_UNIX &&
	    !getsockopt(s, SOL_SOCKET, SO_ACCEPTCONN, &listening, &olen) && listening &&
	    !unix_name(&a, len, name, sizeof(name)))
		snprintf(key, size, "sock:%s:unix:%s", shim_hostname(), name);
	close(s);
}

/* 0 and e filled for a connected socket of the application; else errno. */
static int describe_end(int fd, struct sock_end *e)
{
	struct stat st;
	int s = app_getfd(fd), domain = 0, type = 0, err = ENOTCONN;
	socklen_t len = sizeof(int);

	if (s < 0)
		return errno;
	memset(e, 0, sizeof(*e));
	if (fstat(s, &st) || getsockopt(s, SOL_SOCKET, SO_DOMAIN, &domain, &len))
		goto out;
	len = sizeof(int);
	getsockopt(s, SOL_SOCKET, SO_TYPE, &type, &len);
	if (domain == AF_UNIX)
		err = unix_end(s, st.st_ino, e);
	else if (domain == AF_INET || domain == AF_INET6)
		err = inet_end(s, type, e);
out:
	close(s);
	return err;
}

/* SUSPEND: name every connected end and Unix listener of this process. */
int socket_peers_publish(const int *socks, int n)
{
	char pid[16];

	snprintf(pid, sizeof(pid), "%d", getpid());
	for (int i = 0; i < n; i++) {
		struct sock_end e;
		int err = 0;

		if (!describe_end(socks[i], &e))
			err = ckpt_kv_put(e.mine, pid);
		unix_listener_key(socks[i], e.mine, sizeof(e.mine));
		if (!err && e.mine[0])
			err = ckpt_kv_put(e.mine, pid);
		if (err)
			return err;
	}
	return 0;
}

/* DRAIN: whether fd's peer is a process of the job (1), outside (0, and
 * the user is told), or fd is no connected socket (-1). */
int socket_peer_in_job(int fd)
{
	struct sock_end e;
	char owner[32];
	int err;

	if (describe_end(fd, &e))
		return -1;
	err = ckpt_kv_get(e.theirs, owner, sizeof(owner));
	if (!err)
		return 1;
	if (err == ENOENT)
		ckpt_warn("fd %d is connected outside the job, to %s: a restart connects it again, "
			  "but that peer's state is not part of the checkpoint", fd, e.peer_text);
	return 0;
}
