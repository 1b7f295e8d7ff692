/*
 * Sockets of the job (saved by native/shim/state/sockets.c, socket_peers.c,
 * backlog.c and tcp_flush.c): pid 1 of the restart namespace connects the
 * two ends of each connection inside the job again, TCP ones on their old
 * ports, refills their queues, reconnects those leading outside the job,
 * meets the other hosts' restarts for connections across hosts
 * (cross_host.c), gives ends whose peer closed (datagram ones too) a
 * stand-in peer that sends their queue and closes, and shuts down what
 * was shut down.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <linux/filter.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <stdlib.h>
#include <termios.h>
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <linux/if_packet.h>
#include <linux/netlink.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include "ckpt_sockopts.h"
#include "restart.h"
#include "sys.h"

struct shared_socket {
	uint64_t id;
	const struct loaded_fd *rec;	/* the record with its queue, else its first */
	const struct image *img;	/* and the image that has it */
	int fd;
	int ghosted;			/* its queue came from a stand-in peer */
};

static struct shared_socket *socks;
static unsigned nsocks;

static struct shared_socket *find_socket(uint64_t id)
{
	for (unsigned i = 0; i < nsocks; i++)
		if (socks[i].id == id)
			return &socks[i];
	return NULL;
}

/*
 * An address in the given family (AF_INET or AF_INET6): a dual-stack IPv6
 * socket talks IPv4 through IPv4-mapped addresses (::ffff:a.b.c.d), so one
 * end of a connection may see the other's address either way.
 */
static void in_family(struct ckpt_sockaddr *a, int family)
{
	struct sockaddr_in in;
	struct sockaddr_in6 in6;

	memcpy(&in, a->addr, sizeof(in));
	memcpy(&in6, a->addr, sizeof(in6));
	if (family == AF_INET && a->len >= sizeof(in6) && in6.sin6_family == AF_INET6 &&
	    IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
		in = (struct sockaddr_in){ .sin_family = AF_INET, .sin_port = in6.sin6_port };
		memcpy(&in.sin_addr, &in6.sin6_addr.s6_addr[12], 4);
		memset(a->addr, 0, sizeof(a->addr));
		memcpy(a->addr, &in, sizeof(in));
		a->len = sizeof(in);
	} else if (family == AF_INET6 && a->len >= sizeof(in) && in.sin_family == AF_INET) {
		in6 = (struct sockaddr_in6){ .sin6_family = AF_INET6, .sin6_port = in.sin_port };
		in6.sin6_addr.s6_addr[10] = in6.sin6_addr.s6_addr[11] = 0xff;
		memcpy(&in6.sin6_addr.s6_addr[12], &in.sin_addr, 4);
		memset(a->addr, 0, sizeof(a->addr));
		memcpy(a->addr, &in6, sizeof(in6));
		a->len = sizeof(in6);
	}
}

int same_addr(const struct ckpt_sockaddr *a, const struct ckpt_sockaddr *b)
{
	struct ckpt_sockaddr x = *a, y = *b;

	in_family(&x, AF_INET);
	in_family(&y, AF_INET);
	return x.len && x.len == y.len && !memcmp(x.addr, y.addr, x.len);
}

static int is_tcp(const struct ckpt_fd *f)
{
	return (f->sock_domain == AF_INET || f->sock_domain == AF_INET6) &&
	       f->sock_type == SOCK_STREAM;
}

static const struct sockaddr *sa(const struct ckpt_sockaddr *a)
{
	return (const struct sockaddr *)a->addr;
}

/* Why socket() may refuse what the application could make: its privileges. */
static const char *privilege_needed(const struct ckpt_fd *f)
{
	if (f->sock_domain == AF_PACKET || f->sock_type == SOCK_RAW)
		return ": a raw or packet socket needs CAP_NET_RAW";
	if (f->sock_protocol == IPPROTO_ICMP || f->sock_protocol == IPPROTO_ICMPV6)
		return ": an ICMP socket needs a group within net.ipv4.ping_group_range";
	return "";
}

int restart_socket(const struct ckpt_fd *f)
{
	int s = socket(f->sock_domain, f->sock_type | SOCK_CLOEXEC, f->sock_protocol);
	int one = 1;

	if (s < 0)
		die("fd %d: cannot recreate a socket: %s%s", f->fd, strerror(errno),
		    errno == EPERM || errno == EACCES ? privilege_needed(f) : "");
	if (f->sock_domain == AF_INET || f->sock_domain == AF_INET6)
		setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	sockopts_apply(s, f);
	return move_high(s, "a socket");
}

const char *sockaddr_text(const struct ckpt_sockaddr *a, char *buf, size_t size)
{
	const struct sockaddr_in *in = (const void *)a->addr;
	const struct sockaddr_in6 *in6 = (const void *)a->addr;
	char host[INET6_ADDRSTRLEN] = "?";

	if (in->sin_family == AF_INET)
		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
	else if (in->sin_family == AF_INET6)
		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
	snprintf(buf, size, "%s:%u", host, ntohs(in->sin_port));
	return buf;
}

/* A Unix socket file left by the checkpointed process is in the way. */
static void unlink_stale_name(const struct ckpt_fd *f)
{
	const struct sockaddr_un *un = (const void *)f->sock_local.addr;
	struct stat st;

	if (f->sock_domain == AF_UNIX && un->sun_path[0] && stat(un->sun_path, &st) == 0 &&
	    S_ISSOCK(st.st_mode))
		unlink(un->sun_path);
}

/* TIME_WAIT of connections that a socket without SO_REUSEADDR closed
 * first (a job that ended on this host a moment ago: MPI libraries
 * number their listeners from the same first port) holds the port for a
 * minute: ended where we may (time_wait.c), else waited for, once,
 * rather than fail the restart. */
#define TIME_WAIT_SECONDS 65

static int bind_after_time_wait(int s, const struct ckpt_fd *f, const char *at)
{
	static time_t deadline;	/* one minute for all of them: they ended together */
	struct timespec pause = { 0, 250 * 1000 * 1000 };
	int ended;

	if (f->sock_type == SOCK_STREAM && (ended = end_time_wait(sa(&f->sock_local))) > 0) {
		warn("port %s was held by %d connection%s in TIME_WAIT (a job that just ended "
		     "here?): ended", at, ended, ended == 1 ? "" : "s");
		if (!bind(s, sa(&f->sock_local), f->sock_local.len))
			return 1;
		if (errno != EADDRINUSE)
			return 0;
	}
	if (!deadline) {
		warn("port %s is taken, by the TIME_WAIT of a job that just ended here?: "
		     "waiting up to %d s for it", at, TIME_WAIT_SECONDS);
		deadline = time(NULL) + TIME_WAIT_SECONDS;
	}
	while (time(NULL) < deadline) {
		nanosleep(&pause, NULL);
		if (!bind(s, sa(&f->sock_local), f->sock_local.len))
			return 1;
		if (errno != EADDRINUSE)
			return 0;
	}
	return 0;
}

/*
 * The address to bind again (pair of is_bound, native/shim/state/sockets.c): a
 * netlink socket's groups with a port id the kernel chooses (the old one
 * may be taken), a packet socket's interface by name.
 */
static struct ckpt_sockaddr address_to_bind(const struct loaded_fd *lf)
{
	struct ckpt_sockaddr at = lf->f.sock_local;
	struct sockaddr_nl *nl = (struct sockaddr_nl *)at.addr;
	struct sockaddr_ll *ll = (struct sockaddr_ll *)at.addr;

	if (lf->f.sock_domain == AF_NETLINK) {
		nl->nl_pid = 0;
	} else if (lf->f.sock_domain == AF_PACKET) {
		ll->sll_ifindex = if_nametoindex(lf->path);
		if (!ll->sll_ifindex)
			die("fd %d: its packet socket was bound to interface %s, which this host "
			    "does not have", lf->f.fd, lf->path);
		at.len = sizeof(*ll);	/* getsockname gives less; bind wants it all */
	}
	return at;
}

static void bind_as_before(int s, const struct shared_socket *ss)
{
	const struct ckpt_fd *f = &ss->rec->f;
	const struct ckpt_sockaddr local = address_to_bind(ss->rec);

	/* a relative socket file name is relative to the process's cwd */
	if (f->sock_domain == AF_UNIX && chdir(ss->img->proc->cwd))
		die("cannot bind socket %s: %s: %s", f->sock_local.addr + 2, ss->img->proc->cwd,
		    strerror(errno));
	unlink_stale_name(f);
	if (bind(s, sa(&local), local.len)) {
		char at[128];

		if (f->sock_domain == AF_UNIX)
			snprintf(at, sizeof(at), "%s", f->sock_local.addr + 2);
		else
			sockaddr_text(&f->sock_local, at, sizeof(at));
		if (errno == EADDRINUSE && f->sock_domain != AF_UNIX && bind_after_time_wait(s, f, at))
			return;
		if (errno == EADDRINUSE && f->sock_domain != AF_UNIX)
			die("cannot bind a socket to %s again: it is in use (for longer than "
			    "connections that ended stay in TIME_WAIT)", at);
		if (errno == EADDRNOTAVAIL)
			die("cannot bind a socket to %s again: this host does not have that "
			    "address (the program did not ask for IP_FREEBIND)", at);
		die("cannot bind a socket to %s again: %s", at, strerror(errno));
	}
}

/* The record of the other end of a connection inside the job. */
static const struct loaded_fd *peer_record(const struct loaded_fd *lf)
{
	const struct ckpt_fd *f = &lf->f;

	for (unsigned i = 0; i < nsocks; i++) {
		const struct ckpt_fd *o = &socks[i].rec->f;

		/* an IPv4 end may be connected to an IPv6 one (same_addr) */
		if (o == f || !(o->sock_flags & CKPT_SOCK_CONNECTED) ||
		    (o->sock_domain == AF_UNIX) != (f->sock_domain == AF_UNIX) ||
		    o->sock_type != f->sock_type)
			continue;
		if (f->sock_domain == AF_UNIX ? (f->peer_id && o->object_id == f->peer_id) :
		    (same_addr(&o->sock_local, &f->sock_peer) &&
		     same_addr(&o->sock_peer, &f->sock_local)))
			return socks[i].rec;
	}
	return NULL;
}

/*
 * A queue larger than a new connection holds (bytes its sender had held,
 * which FLUSH saved) needs a receive buffer that is large before the
 * connection opens its window, and a large send buffer at the sender.
 */
#define LARGE_QUEUE (512 << 10)

static void make_room(int s, int opt, uint64_t bytes)
{
	if (bytes > LARGE_QUEUE)
		ckpt_raise_socket_buffer(s, opt, bytes);
}

/* A listener of a moment at b's address (or any port of it), the other
 * end bound to a's (or not): 0, or errno. */
static int tcp_connect_through(const struct ckpt_fd *a, const struct ckpt_fd *b, int keep_ports,
			       int *fa, int *fb)
{
	struct ckpt_sockaddr at = b->sock_local;
	socklen_t len = sizeof(at.addr);
	int l = restart_socket(b), err = 0;

	make_room(l, SO_RCVBUF, b->data_size);	/* the accepted socket inherits it */
	if (!keep_ports)
		((struct sockaddr_in *)at.addr)->sin_port = 0;	/* same for IPv6 */
	*fa = -1;
	if (bind(l, sa(&at), at.len) || listen(l, 1) ||
	    getsockname(l, (struct sockaddr *)at.addr, &len)) {
		err = errno;
		goto out;
	}
	*fa = restart_socket(a);
	in_family(&at, a->sock_domain);
	make_room(*fa, SO_RCVBUF, a->data_size);
	make_room(*fa, SO_SNDBUF, b->data_size);
	if ((keep_ports && bind(*fa, sa(&a->sock_local), a->sock_local.len)) ||
	    connect(*fa, sa(&at), at.len)) {
		err = errno;
		close(*fa);
		goto out;
	}
	*fb = accept4(l, NULL, NULL, SOCK_CLOEXEC);
	if (*fb < 0) {
		err = errno;
		close(*fa);
		goto out;
	}
	*fb = move_high(*fb, "a socket");
	sockopts_apply(*fb, b);	/* it has the listener's, of a moment */
	make_room(*fb, SO_RCVBUF, b->data_size);
	make_room(*fb, SO_SNDBUF, a->data_size);
out:
	close(l);
	return err;
}

/* A TCP connection with both ends in the job: on its old ports if they
 * are free; a restart on the same host soon after finds them taken by
 * the old connection's TIME_WAIT, and then new ports do (as in DMTCP:
 * the application keeps its fds, only getsockname() tells). */
static void tcp_pair(const struct ckpt_fd *a, const struct ckpt_fd *b, int *fa, int *fb)
{
	char la[64], lb[64];
	int err = tcp_connect_through(a, b, 1, fa, fb);

	if (err == EADDRINUSE)
		err = tcp_connect_through(a, b, 0, fa, fb);
	if (err)
		die("cannot reconnect TCP %s-%s: %s", sockaddr_text(&a->sock_local, la, sizeof(la)),
		    sockaddr_text(&b->sock_local, lb, sizeof(lb)), strerror(err));
}

static void connect_pair(struct shared_socket *a, struct shared_socket *b)
{
	int sv[2];

	if (a->rec->f.sock_domain != AF_UNIX) {
		tcp_pair(&a->rec->f, &b->rec->f, &a->fd, &b->fd);
		return;
	}
	if (socketpair(AF_UNIX, a->rec->f.sock_type | SOCK_CLOEXEC, 0, sv))
		die("cannot recreate a socket pair: %s", strerror(errno));
	a->fd = move_high(sv[0], "a socket");
	b->fd = move_high(sv[1], "a socket");
	sockopts_apply(a->fd, &a->rec->f);
	sockopts_apply(b->fd, &b->rec->f);
}

/* Connected to an address that is not a socket of the job: connect
 * again (a listener of the job, or a server that is still there). */
static int reconnect(const struct loaded_fd *lf)
{
	const struct ckpt_fd *f = &lf->f;
	int s = restart_socket(f);

	if (f->sock_domain != AF_UNIX && (f->sock_flags & CKPT_SOCK_BOUND)) {
		struct ckpt_sockaddr local = address_to_bind(lf);

		bind(s, sa(&local), local.len);
	}
	if (!f->sock_peer.len || connect(s, sa(&f->sock_peer), f->sock_peer.len))
		warn("a socket connected outside the job (%s) could not be reconnected: %s",
		     f->sock_domain == AF_UNIX ? ((const struct sockaddr_un *)f->sock_peer.addr)->sun_path :
		     is_tcp(f) ? "TCP" : "not a stream", strerror(errno));
	return s;
}

#define REFILL_GROWTHS 4

/*
 * The peer end sends the bytes again.  They fit in the receiver's queue
 * and the sender's, as they did in the old connection, unless the sender
 * held many (FLUSH saved them): its buffer then grows, as it had grown.
 */
static void send_all(int s, const char *p, size_t len)
{
	int growths = 0;

	while (len) {
		ssize_t n = send(s, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		struct pollfd pfd = { .fd = s, .events = POLLOUT };

		if (n > 0) {
			p += n;
			len -= n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno != EAGAIN)
			die("cannot refill a socket: %s", strerror(errno));
		if (poll(&pfd, 1, 200) > 0)
			continue;
		if (growths++ == REFILL_GROWTHS)
			die("%zu bytes queued on a socket do not fit in a new connection (its "
			    "buffers are capped by net.core.wmem_max and rmem_max)", len);
		ckpt_grow_send_buffer(s, len);
	}
}

/* The saved receive queue of rec, sent again by its peer end. */
static void refill_socket(const struct loaded_fd *lf, int peer)
{
	const char *p = lf->data, *end = lf->data + lf->f.data_size;

	if (lf->f.sock_type == SOCK_STREAM) {
		send_all(peer, p, end - p);
		return;
	}
	while (p + 4 <= end) {
		uint32_t len;

		memcpy(&len, p, 4);
		if (p + 4 + len > end)
			die("corrupt socket queue record");
		if (send(peer, p + 4, len, MSG_NOSIGNAL) != (ssize_t)len)
			die("cannot refill a socket: %s", strerror(errno));
		p += 4 + len;
	}
}

/*
 * A TCP end whose peer had shut down writing or closed, and is in no
 * image (it closed, or is outside the job): a stand-in peer of a moment,
 * on loopback, sends its queue again and its FIN, and closes.  Reads then
 * give the bytes and EOF, and writes end in a reset, as they would have.
 */
static void connect_to_ghost(struct shared_socket *ss)
{
	const struct ckpt_fd *f = &ss->rec->f;
	struct ckpt_sockaddr at = { .len = f->sock_domain == AF_INET6 ?
					   sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in) };
	struct sockaddr_in *in = (struct sockaddr_in *)at.addr;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)at.addr;
	socklen_t len = sizeof(at.addr);
	int l = socket(f->sock_domain, SOCK_STREAM | SOCK_CLOEXEC, 0), g;

	if (f->sock_domain == AF_INET6) {
		in6->sin6_family = AF_INET6;
		in6->sin6_addr = in6addr_loopback;
	} else {
		in->sin_family = AF_INET;
		in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	}
	if (l < 0 || bind(l, sa(&at), at.len) || listen(l, 1) ||
	    getsockname(l, (struct sockaddr *)at.addr, &len))
		die("cannot make a stand-in for a closed TCP peer: %s", strerror(errno));
	ss->fd = restart_socket(f);
	make_room(ss->fd, SO_RCVBUF, f->data_size);
	/* its old port, if the old connection's TIME_WAIT leaves it free */
	if (f->sock_flags & CKPT_SOCK_BOUND)
		bind(ss->fd, sa(&f->sock_local), f->sock_local.len);
	if (connect(ss->fd, sa(&at), at.len) || (g = accept4(l, NULL, NULL, SOCK_CLOEXEC)) < 0)
		die("cannot connect a TCP socket to a stand-in for its closed peer: %s",
		    strerror(errno));
	close(l);
	make_room(g, SO_SNDBUF, f->data_size);
	refill_socket(ss->rec, g);
	shutdown(g, SHUT_WR);
	close(g);
	ss->ghosted = 1;
}

/*
 * A Unix stream or seqpacket end whose peer closed (its peer's inode is
 * gone: sock_diag names none) or, outside the job, shut down both ways:
 * both directions are shut and no image has the peer.
 */
static int unix_peer_gone(const struct loaded_fd *lf)
{
	const unsigned both = CKPT_SOCK_SHUT_RD | CKPT_SOCK_SHUT_WR;
	const struct ckpt_fd *f = &lf->f;

	return f->sock_domain == AF_UNIX && f->sock_type != SOCK_DGRAM &&
	       (f->sock_flags & CKPT_SOCK_CONNECTED) && (f->sock_flags & both) == both &&
	       !peer_record(lf);
}

/* The other end of a new pair stands in for the peer: it sends the queue
 * again (seqpacket: message by message) and closes.  Reads then give the
 * bytes and EOF, writes EPIPE, as they did. */
static void pair_with_ghost(struct shared_socket *ss)
{
	const struct ckpt_fd *f = &ss->rec->f;
	int sv[2];

	if (socketpair(AF_UNIX, f->sock_type | SOCK_CLOEXEC, 0, sv))
		die("cannot recreate a socket whose peer closed: %s", strerror(errno));
	ss->fd = move_high(sv[0], "a socket");
	sockopts_apply(ss->fd, f);
	/* the queue was in the closed peer's send buffer, however large it was */
	ckpt_raise_socket_buffer(sv[1], SO_SNDBUF, 2 * f->data_size);
	refill_socket(ss->rec, sv[1]);
	close(sv[1]);
	ss->ghosted = 1;
}

/*
 * A Unix datagram socket whose peer closed: the kernel keeps it connected
 * to the dead socket (getpeername still names it, sock_diag gives no peer
 * inode) until a send fails with ECONNREFUSED.
 */
static int unix_dgram_peer_gone(const struct loaded_fd *lf)
{
	const struct ckpt_fd *f = &lf->f;

	return f->sock_domain == AF_UNIX && f->sock_type == SOCK_DGRAM &&
	       (f->sock_flags & CKPT_SOCK_CONNECTED) && !f->peer_id;
}

static const char *unix_path(const struct ckpt_sockaddr *a)
{
	return ((const struct sockaddr_un *)a->addr)->sun_path;
}

/* A name in the file system that is in the way of a bind of a moment:
 * moved aside next to itself (1), to be put back by put_back(). */
static int move_aside(const char *path, char *aside, size_t size)
{
	struct stat st;

	if (lstat(path, &st))
		return 0;
	snprintf(aside, size, "%s.ckpt-aside-%d", path, getpid());
	if (strlen(path) + 32 > size || rename(path, aside))
		die("cannot move %s aside for a moment to name a closed socket peer: %s", path,
		    strerror(errno ? errno : ENAMETOOLONG));
	return 1;
}

static void put_back(const char *path, const char *aside, int moved)
{
	unlink(path);
	if (moved && rename(aside, path))
		die("cannot put %s back: %s", path, strerror(errno));
}

/*
 * The stand-in gets the closed peer's name, so that getpeername and
 * recvfrom name it as before: bound for a moment (relative names in the
 * process's working directory), its socket file removed again and what
 * was there put back.  A name the stand-in cannot take is said.
 */
static void name_ghost(int ghost, const struct shared_socket *ss)
{
	const struct ckpt_fd *f = &ss->rec->f;
	const char *path = unix_path(&f->sock_peer);
	char aside[sizeof(struct sockaddr_un) + 32];
	int abstract = !path[0], moved = 0;

	if (f->sock_peer.len <= sizeof(sa_family_t))
		return;		/* unnamed, as a socketpair's end */
	if (!abstract && chdir(ss->img->proc->cwd))
		die("pid %d: cannot enter its working directory %s: %s", ss->img->hdr.pid,
		    ss->img->proc->cwd, strerror(errno));
	if (!abstract)
		moved = move_aside(path, aside, sizeof(aside));
	if (bind(ghost, sa(&f->sock_peer), f->sock_peer.len))
		warn("pid %d: fd %d: the name of its closed datagram peer (%s%s) cannot be given "
		     "back: %s; getpeername and recvfrom give no name", ss->img->hdr.pid, f->fd,
		     abstract ? "@" : "", path + abstract, strerror(errno));
	if (!abstract)
		put_back(path, aside, moved);
}

/* The other end of a new datagram pair stands in for the dead peer: it
 * sends the queue again, datagram by datagram, and closes.  The end is
 * then connected to a dead socket, as it was. */
static void dgram_pair_with_ghost(struct shared_socket *ss)
{
	const struct ckpt_fd *f = &ss->rec->f;
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv))
		die("cannot recreate a datagram socket whose peer closed: %s", strerror(errno));
	ss->fd = move_high(sv[0], "a socket");
	sockopts_apply(ss->fd, f);
	if (f->sock_flags & CKPT_SOCK_BOUND)
		bind_as_before(ss->fd, ss);
	name_ghost(sv[1], ss);
	ckpt_raise_socket_buffer(sv[1], SO_SNDBUF, 2 * f->data_size);
	refill_socket(ss->rec, sv[1]);
	close(sv[1]);
	ss->ghosted = 1;
}

/* Datagrams waiting on a named socket (from whoever sent them): sent to
 * its name again, from a socket of a moment. */
static void refill_by_name(const struct loaded_fd *lf)
{
	const char *p = lf->data, *end = lf->data + lf->f.data_size;
	int s = socket(lf->f.sock_domain, lf->f.sock_type | SOCK_CLOEXEC, 0);

	if (s < 0)
		die("cannot refill a socket: %s", strerror(errno));
	while (p + 4 <= end) {
		uint32_t len;

		memcpy(&len, p, 4);
		if (p + 4 + len > end)
			die("corrupt socket queue record");
		if (sendto(s, p + 4, len, MSG_NOSIGNAL, sa(&lf->f.sock_local),
			   lf->f.sock_local.len) != (ssize_t)len)
			die("cannot refill a socket: %s", strerror(errno));
		p += 4 + len;
	}
	close(s);
}

/*
 * Unix and TCP sockets shut down, once their queues are refilled (a
 * socket shut for writing sends nothing more).  A stream end shut for
 * writing shuts its peer for reading too, as the kernel did; its own
 * SHUT_RD is that side of its peer's SHUT_WR (for TCP, unless the peer
 * sent no FIN: then the end shut itself).  A datagram socket's bits are
 * its own.
 */
static int how_to_shut(const struct ckpt_fd *f)
{
	int rd = f->sock_flags & CKPT_SOCK_SHUT_RD, wr = f->sock_flags & CKPT_SOCK_SHUT_WR;

	if (is_tcp(f) && (f->sock_flags & CKPT_SOCK_PEER_FIN))
		rd = 0;
	else if (f->sock_domain == AF_UNIX && f->sock_type != SOCK_DGRAM)
		rd = 0;
	else if (!is_tcp(f) && f->sock_domain != AF_UNIX)
		return -1;
	return rd && wr ? SHUT_RDWR : rd ? SHUT_RD : wr ? SHUT_WR : -1;
}

/* Pair of save_filter (native/shim/state/sockets.c): once the queue is back,
 * which the filter let through already (refilled datagrams come from
 * other addresses, which it might not). */
static void attach_filters(void)
{
	for (unsigned i = 0; i < nsocks; i++) {
		const struct loaded_fd *lf = socks[i].rec;
		struct sock_fprog prog = { lf->f.sock_filter_len, (void *)lf->sock_filter };
		int one = 1;

		if (!lf->sock_filter)
			continue;
		if (setsockopt(socks[i].fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof(prog)))
			die("pid %d: fd %d: cannot attach its socket filter again: %s",
			    socks[i].img->hdr.pid, lf->f.fd, strerror(errno));
		if ((lf->f.sock_flags & CKPT_SOCK_FILTER_LOCKED) &&
		    setsockopt(socks[i].fd, SOL_SOCKET, SO_LOCK_FILTER, &one, sizeof(one)))
			die("pid %d: fd %d: cannot lock its socket filter again: %s",
			    socks[i].img->hdr.pid, lf->f.fd, strerror(errno));
	}
}

static void shut_down_as_before(void)
{
	for (unsigned i = 0; i < nsocks; i++) {
		const struct ckpt_fd *f = &socks[i].rec->f;
		int how = how_to_shut(f);

		if (how >= 0 && shutdown(socks[i].fd, how) && errno != ENOTCONN)
			warn("a socket could not be shut down again: %s", strerror(errno));
	}
}

static void collect_sockets(struct image *imgs, unsigned n)
{
	unsigned total = 0;

	for (unsigned i = 0; i < n; i++)
		total += imgs[i].nfds;
	socks = arena_alloc(sizeof(*socks) * (total + 1));
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++) {
			const struct loaded_fd *lf = &imgs[i].fds[j];
			struct shared_socket *known;

			if (lf->f.kind != CKPT_FD_SOCKET || lf->f.dup_of >= 0)
				continue;
			/* of a socket shared by several processes, the one that
			 * flushed it carries its queue (tcp_flush.c) */
			known = find_socket(lf->f.object_id);
			if (known && !known->rec->f.data_size && lf->f.data_size)
				*known = (struct shared_socket){ lf->f.object_id, lf, &imgs[i], -1, 0 };
			if (!known)
				socks[nsocks++] = (struct shared_socket){ lf->f.object_id, lf, &imgs[i], -1, 0 };
		}
}

/* TCP connections to processes of the job on other hosts, met through
 * the coordinator (cross_host.c); their far ends' queues sent again. */
static struct cross_end *cross_ends;
static unsigned ncross;

static void connect_other_hosts(const char *coord)
{
	cross_ends = arena_alloc(sizeof(*cross_ends) * (nsocks + 1));
	for (unsigned i = 0; i < nsocks; i++) {
		const struct loaded_fd *far;

		if (socks[i].fd >= 0 || !(far = cross_host_peer(&socks[i].rec->f)))
			continue;
		cross_ends[ncross++] = (struct cross_end){ &socks[i].rec->f, far, -1, i };
	}
	cross_host_connect(cross_ends, ncross, coord);
	for (unsigned k = 0; k < ncross; k++)
		socks[cross_ends[k].index].fd = cross_ends[k].fd;
}

static void refill_from_other_hosts(void)
{
	for (unsigned k = 0; k < ncross; k++)
		if (cross_ends[k].far->f.data_size)
			refill_socket(cross_ends[k].far, cross_ends[k].fd);
}

/* Connections inside the job first (TCP ones need their ports before
 * any listener takes them; on this host, then with other hosts), then
 * listeners and named sockets, then connections to those, then the rest. */
void sockets_create(struct image *imgs, unsigned n, const char *coord)
{
	collect_sockets(imgs, n);
	for (unsigned i = 0; i < nsocks; i++) {
		const struct ckpt_fd *f = &socks[i].rec->f;
		const struct loaded_fd *peer;

		/* a connected UDP (ICMP, raw...) socket only names its default
		 * peer: it is bound and connected again below, like one
		 * connected outside */
		if (socks[i].fd >= 0 || !(f->sock_flags & CKPT_SOCK_CONNECTED) ||
		    (f->sock_domain != AF_UNIX && !is_tcp(f)))
			continue;
		peer = peer_record(socks[i].rec);
		if (peer)
			connect_pair(&socks[i], find_socket(peer->f.object_id));
	}
	connect_other_hosts(coord);
	for (unsigned i = 0; i < nsocks; i++)
		if (socks[i].fd < 0 && is_tcp(&socks[i].rec->f) &&
		    (socks[i].rec->f.sock_flags & CKPT_SOCK_PEER_FIN))
			connect_to_ghost(&socks[i]);
	for (unsigned i = 0; i < nsocks; i++)
		if (socks[i].fd < 0 && unix_peer_gone(socks[i].rec))
			pair_with_ghost(&socks[i]);
	for (unsigned i = 0; i < nsocks; i++)
		if (socks[i].fd < 0 && unix_dgram_peer_gone(socks[i].rec))
			dgram_pair_with_ghost(&socks[i]);
	for (unsigned i = 0; i < nsocks; i++) {
		const struct ckpt_fd *f = &socks[i].rec->f;

		if (socks[i].fd >= 0 || (f->sock_flags & CKPT_SOCK_CONNECTED) ||
		    !(f->sock_flags & (CKPT_SOCK_BOUND | CKPT_SOCK_LISTENING)))
			continue;
		socks[i].fd = restart_socket(f);
		bind_as_before(socks[i].fd, &socks[i]);
		if ((f->sock_flags & CKPT_SOCK_LISTENING) && listen(socks[i].fd, f->sock_backlog))
			die("cannot listen again: %s", strerror(errno));
	}
	for (unsigned i = 0; i < nsocks; i++)
		if (socks[i].fd < 0)
			socks[i].fd = socks[i].rec->f.sock_flags & CKPT_SOCK_CONNECTED ?
				reconnect(socks[i].rec) : restart_socket(&socks[i].rec->f);
	for (unsigned i = 0; i < nsocks; i++) {
		const struct loaded_fd *lf = socks[i].rec, *peer;

		sockopts_finish(socks[i].fd, &lf->f);
		if (!lf->f.data_size || socks[i].ghosted)
			continue;
		peer = peer_record(lf);
		if (peer)
			refill_socket(lf, find_socket(peer->f.object_id)->fd);
		else if (cross_host_peer(&lf->f))
			continue;	/* the other host sends it */
		else if (lf->f.sock_type != SOCK_STREAM && (lf->f.sock_flags & CKPT_SOCK_BOUND))
			refill_by_name(lf);
		else
			warn("%zu bytes queued on a socket from outside the job are dropped",
			     (size_t)lf->f.data_size);
	}
	refill_from_other_hosts();
	attach_filters();
	shut_down_as_before();
}

int shared_socket_fd(uint64_t id)
{
	const struct shared_socket *s = find_socket(id);

	return s ? s->fd : -1;
}

unsigned socket_fds(int *out, unsigned max)
{
	unsigned k = 0;

	for (unsigned i = 0; i < nsocks && k < max; i++)
		out[k++] = socks[i].fd;
	return k;
}

void sockets_close(void)
{
	for (unsigned i = 0; i < nsocks; i++)
		close(socks[i].fd);
}
