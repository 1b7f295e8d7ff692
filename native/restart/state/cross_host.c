/*
 * TCP connections of the job whose two ends are on different hosts.
 *
 * Each host's ckpt-restart restores that host's images; it also loads the
 * other hosts' (--peer-image: their records, not their memory) to find the
 * far end of each of its connections and the bytes queued there.  The two
 * ckpt-restarts meet through the coordinator's name service (kv.c): the end
 * with the lower address listens for a moment on its own address, the other
 * binds its old port and connects, and says from where; then each sends
 * again what the far end had queued to receive, as shared.c does for a
 * connection within the host.  Every host first listens, then connects,
 * then accepts, so no ckpt-restart waits for one that waits for it.
 *
 * A host restarted on another host (--addr-map OLD=NEW) has every saved
 * address of it rewritten before anything is bound or connected.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "restart.h"

#define MAX_MOVES 256
#define MEET_SECONDS 120	/* the other hosts' ckpt-restarts load their images first */
#define ACCEPT_MS 60000

struct addr_move {
	struct in_addr from, to;
};

static struct addr_move moves[MAX_MOVES];
static unsigned nmoves;
static struct image peer_imgs[MAX_IMAGES];
static unsigned npeers;

/* ---- addresses of moved hosts ----------------------------------------- */

void addr_map_add(const char *spec)
{
	char from[64];
	const char *eq = strchr(spec, '=');

	if (!eq || eq - spec >= (long)sizeof(from) || nmoves == MAX_MOVES)
		die("--addr-map %s: want OLD=NEW (IPv4 addresses)", spec);
	snprintf(from, sizeof(from), "%.*s", (int)(eq - spec), spec);
	if (inet_pton(AF_INET, from, &moves[nmoves].from) != 1 ||
	    inet_pton(AF_INET, eq + 1, &moves[nmoves].to) != 1)
		die("--addr-map %s: want OLD=NEW (IPv4 addresses)", spec);
	nmoves++;
}

/* The IPv4 address in a, plain or IPv4-mapped IPv6; NULL if none. */
static struct in_addr *ipv4_of(struct ckpt_sockaddr *a)
{
	struct sockaddr_in *in = (void *)a->addr;
	struct sockaddr_in6 *in6 = (void *)a->addr;

	if (a->len >= sizeof(*in) && in->sin_family == AF_INET)
		return &in->sin_addr;
	if (a->len >= sizeof(*in6) && in6->sin6_family == AF_INET6 &&
	    IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr))
		return (struct in_addr *)&in6->sin6_addr.s6_addr[12];
	return NULL;
}

static void move_addr(struct ckpt_sockaddr *a)
{
	struct in_addr *ip = ipv4_of(a);

	for (unsigned i = 0; ip && i < nmoves; i++)
		if (ip->s_addr == moves[i].from.s_addr) {
			*ip = moves[i].to;
			return;
		}
}

void addr_map_apply(struct image *imgs, unsigned n)
{
	for (unsigned i = 0; nmoves && i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++) {
			struct ckpt_fd *f = &imgs[i].fds[j].f;

			if (f->kind != CKPT_FD_SOCKET)
				continue;
			move_addr(&f->sock_local);
			move_addr(&f->sock_peer);
		}
}

/* For the shim's virtual addresses (net_addresses.c). */
unsigned addr_map_get(struct ckpt_addr_move *out, unsigned max)
{
	unsigned n = nmoves < max ? nmoves : max;

	for (unsigned i = 0; i < n; i++)
		out[i] = (struct ckpt_addr_move){ moves[i].from.s_addr, moves[i].to.s_addr };
	return n;
}

/* ---- the other hosts' images ------------------------------------------ */

void cross_host_load(const char *const *paths, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		image_load_peer(&peer_imgs[i], paths[i]);
		close(peer_imgs[i].fd);	/* what we need is in the arena now */
		peer_imgs[i].fd = -1;
	}
	npeers = n;
	addr_map_apply(peer_imgs, npeers);
}

static int is_tcp_connection(const struct ckpt_fd *f)
{
	return f->kind == CKPT_FD_SOCKET && f->dup_of < 0 && f->sock_type == SOCK_STREAM &&
	       f->sock_domain != AF_UNIX && (f->sock_flags & CKPT_SOCK_CONNECTED);
}

/* The far end of f on another host (of a socket several processes share
 * there, the record that carries its queue), or NULL. */
const struct loaded_fd *cross_host_peer(const struct ckpt_fd *f)
{
	const struct loaded_fd *found = NULL;

	if (!is_tcp_connection(f))
		return NULL;
	for (unsigned i = 0; i < npeers; i++)
		for (unsigned j = 0; j < peer_imgs[i].nfds; j++) {
			const struct loaded_fd *o = &peer_imgs[i].fds[j];

			if (is_tcp_connection(&o->f) && same_addr(&o->f.sock_local, &f->sock_peer) &&
			    same_addr(&o->f.sock_peer, &f->sock_local) &&
			    (!found || (!found->f.data_size && o->f.data_size)))
				found = o;
		}
	return found;
}

/* ---- meeting the other hosts ------------------------------------------ */

/* The connection's name, the same on both hosts. */
static void conn_key(const struct ckpt_fd *f, const char *prefix, char *key, size_t size)
{
	char l[80], p[80];

	sockaddr_text(&f->sock_local, l, sizeof(l));
	sockaddr_text(&f->sock_peer, p, sizeof(p));
	if (strcmp(l, p) < 0)
		snprintf(key, size, "%s:%s>%s", prefix, l, p);
	else
		snprintf(key, size, "%s:%s>%s", prefix, p, l);
}

static int is_listening_end(const struct ckpt_fd *f)
{
	char l[80], p[80];

	return strcmp(sockaddr_text(&f->sock_local, l, sizeof(l)), sockaddr_text(&f->sock_peer, p, sizeof(p))) < 0;
}

/* Listeners of a moment, one per local address of the listening ends. */
struct meeting {
	int fd;
	const struct ckpt_fd *at;	/* an end it is for */
	struct ckpt_sockaddr where;	/* where it listens */
};

static void set_port(struct ckpt_sockaddr *a, unsigned port)
{
	((struct sockaddr_in *)a->addr)->sin_port = htons(port);	/* same for IPv6 */
}

/* A listener at f's own address; if the port is taken (the old job's
 * connections on this host linger), any port: the far end is told which. */
static int listen_at(const struct ckpt_fd *f, struct ckpt_sockaddr *where)
{
	socklen_t len = sizeof(where->addr);
	char at[80];
	int s = restart_socket(f);

	*where = f->sock_local;
	if (bind(s, (const struct sockaddr *)where->addr, where->len) && errno == EADDRINUSE) {
		set_port(where, 0);
		if (bind(s, (const struct sockaddr *)where->addr, where->len))
			goto fail;
	}
	if (listen(s, SOMAXCONN) || getsockname(s, (struct sockaddr *)where->addr, &len))
		goto fail;
	where->len = len;
	return s;
fail:
	die("cannot listen on %s to reconnect a connection from another host: %s",
	    sockaddr_text(&f->sock_local, at, sizeof(at)), strerror(errno));
}

static int listen_for(struct cross_end *ends, unsigned n, struct meeting *ls)
{
	unsigned nls = 0;

	for (unsigned i = 0; i < n; i++) {
		const struct ckpt_fd *f = ends[i].mine;
		char key[200], where[80];
		unsigned k;

		if (!is_listening_end(f))
			continue;
		for (k = 0; k < nls && !same_addr(&ls[k].at->sock_local, &f->sock_local); k++)
			;
		if (k == nls) {
			ls[nls].at = f;
			ls[nls].fd = listen_at(f, &ls[nls].where);
			nls++;
		}
		conn_key(f, "xtcp", key, sizeof(key));
		kv_put(key, sockaddr_text(&ls[k].where, where, sizeof(where)));
	}
	return nls;
}

/* From this end's old port (or any, if TIME_WAIT holds it) to where the
 * far end listens; then says where it came from. */
static void connect_out(struct cross_end *e)
{
	const struct ckpt_fd *f = e->mine;
	struct ckpt_sockaddr from = f->sock_local, to = f->sock_peer;
	socklen_t len = sizeof(from.addr);
	char key[200], value[80], where[80];
	const char *port;

	conn_key(f, "xtcp", key, sizeof(key));
	kv_wait(key, MEET_SECONDS, value, sizeof(value));
	port = strrchr(value, ':');	/* where the far end listens: its port may be new */
	if (!port)
		die("bad meeting address %s for %s", value, key);
	set_port(&to, atoi(port + 1));
	e->fd = restart_socket(f);
	if (bind(e->fd, (const struct sockaddr *)from.addr, from.len)) {
		set_port(&from, 0);
		if (bind(e->fd, (const struct sockaddr *)from.addr, from.len))
			die("cannot bind to %s: %s", sockaddr_text(&from, where, sizeof(where)), strerror(errno));
	}
	if (connect(e->fd, (const struct sockaddr *)to.addr, to.len))
		die("cannot reconnect to %s on another host: %s", sockaddr_text(&to, where, sizeof(where)),
		    strerror(errno));
	if (getsockname(e->fd, (struct sockaddr *)from.addr, &len))
		die("getsockname: %s", strerror(errno));
	from.len = len;
	conn_key(f, "xtcp-from", key, sizeof(key));
	kv_put(key, sockaddr_text(&from, value, sizeof(value)));
}

/* Accepts on l until every listening end at its address has its
 * connection, told apart by where each came from. */
static void accept_ends(struct meeting *l, struct cross_end *ends, unsigned n)
{
	static char expected[MAX_CROSS_ENDS][80];
	unsigned waiting = 0;

	for (unsigned i = 0; i < n && i < MAX_CROSS_ENDS; i++) {
		const struct ckpt_fd *f = ends[i].mine;
		char key[200];

		expected[i][0] = 0;
		if (!is_listening_end(f) || !same_addr(&f->sock_local, &l->at->sock_local))
			continue;
		conn_key(f, "xtcp-from", key, sizeof(key));
		kv_wait(key, MEET_SECONDS, expected[i], sizeof(expected[i]));
		waiting++;
	}
	while (waiting) {
		struct pollfd pfd = { .fd = l->fd, .events = POLLIN };
		struct ckpt_sockaddr peer;
		socklen_t len = sizeof(peer.addr);
		char from[80];
		unsigned i;
		int s;

		if (poll(&pfd, 1, ACCEPT_MS) <= 0)
			die("a host of the job did not connect back within %d s", ACCEPT_MS / 1000);
		s = accept4(l->fd, (struct sockaddr *)peer.addr, &len, SOCK_CLOEXEC);
		if (s < 0)
			continue;
		peer.len = len;
		sockaddr_text(&peer, from, sizeof(from));
		for (i = 0; i < n && (!expected[i][0] || strcmp(expected[i], from)); i++)
			;
		if (i == n) {
			close(s);	/* not one of ours */
			continue;
		}
		expected[i][0] = 0;
		ends[i].fd = move_high(s, "a socket");
		sockopts_apply(ends[i].fd, ends[i].mine);
		waiting--;
	}
}

void cross_host_connect(struct cross_end *ends, unsigned n, const char *coord)
{
	static struct meeting ls[MAX_CROSS_ENDS];
	unsigned nls;

	if (!n)
		return;
	if (n > MAX_CROSS_ENDS)
		die("too many connections to other hosts (%u, at most %d)", n, MAX_CROSS_ENDS);
	kv_open(coord);
	nls = listen_for(ends, n, ls);
	for (unsigned i = 0; i < n; i++)
		if (!is_listening_end(ends[i].mine))
			connect_out(&ends[i]);
	for (unsigned k = 0; k < nls; k++) {
		accept_ends(&ls[k], ends, n);
		close(ls[k].fd);
	}
	kv_close();
}
