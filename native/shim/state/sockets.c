/*
 * Sockets of the application: what each one is (domain, type, addresses,
 * listening or connected, and for Unix sockets the peer's inode from
 * sock_diag), and a copy of the bytes waiting in its receive queue, taken
 * with MSG_PEEK so nothing is consumed.
 *
 * /proc/<pid>/fd/N cannot open a socket: pidfd_getfd() hands the
 * checkpoint thread the application's own open file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <time.h>
#include <fcntl.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>
#include <net/if.h>
#include <linux/if_packet.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <linux/filter.h>
#include <linux/sockios.h>
#include <netinet/tcp.h>
#include "ckpt_sockopts.h"
#include "shim.h"

#define DGRAM_MAX (256 << 10)

int app_getfd(int fd)
{
	int pidfd = syscall(SYS_pidfd_open, getpid(), 0);
	int ours;

	if (pidfd < 0)
		return -1;
	ours = syscall(SYS_pidfd_getfd, pidfd, fd, 0);
	close(pidfd);
	if (ours >= 0)
		fcntl(ours, F_SETFD, FD_CLOEXEC);
	return ours;
}

/* A Unix socket's peer inode (0: none) and shutdown bits, from sock_diag. */
static void unix_diag(uint64_t ino, uint64_t *peer_ino, unsigned *shutdown_bits)
{
	struct {
		struct nlmsghdr nlh;
		struct unix_diag_req req;
	} msg = {
		.nlh = { .nlmsg_len = sizeof(msg), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
			 .nlmsg_flags = NLM_F_REQUEST },
		.req = { .sdiag_family = AF_UNIX, .udiag_states = ~0U, .udiag_ino = ino,
			 .udiag_show = UDIAG_SHOW_PEER, .udiag_cookie = { ~0U, ~0U } },
	};
	char buf[4096];
	ssize_t n;
	int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);

	*peer_ino = 0;
	*shutdown_bits = 0;
	if (nl < 0)
		return;
	if (send(nl, &msg, sizeof(msg), 0) != sizeof(msg))
		goto out;
	n = recv(nl, buf, sizeof(buf), 0);
	for (struct nlmsghdr *h = (void *)buf; n > 0 && NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
		struct unix_diag_msg *m = NLMSG_DATA(h);
		struct rtattr *a = (void *)(m + 1);
		int len = h->nlmsg_len - NLMSG_LENGTH(sizeof(*m));

		if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY)
			break;
		for (; RTA_OK(a, len); a = RTA_NEXT(a, len))
			if (a->rta_type == UNIX_DIAG_PEER)
				*peer_ino = *(uint32_t *)RTA_DATA(a);
			else if (a->rta_type == UNIX_DIAG_SHUTDOWN)
				*shutdown_bits = *(uint8_t *)RTA_DATA(a);
	}
out:
	close(nl);
}

uint64_t socket_unix_peer(uint64_t ino)
{
	uint64_t peer;
	unsigned shutdown_bits;

	unix_diag(ino, &peer, &shutdown_bits);
	return peer;
}

static int get_int(int s, int level, int opt)
{
	int v = 0;
	socklen_t len = sizeof(v);

	return getsockopt(s, level, opt, &v, &len) ? -1 : v;
}

/* Whether a socket's address was given by bind() (or an automatic bind
 * that a restart must keep: an IP port, an ICMP echo id). */
static int is_bound(const struct ckpt_fd *rec)
{
	const void *a = rec->sock_local.addr;

	switch (rec->sock_domain) {
	case AF_UNIX:		/* more than the family: a name */
		return rec->sock_local.len > sizeof(sa_family_t);
	case AF_NETLINK:	/* its port id is the kernel's to choose again */
		return ((const struct sockaddr_nl *)a)->nl_groups != 0;
	case AF_PACKET:		/* its protocol is socket()'s */
		return ((const struct sockaddr_ll *)a)->sll_ifindex != 0;
	default:		/* a port (raw sockets: their protocol) */
		return ((const struct sockaddr_in *)a)->sin_port != 0;
	}
}

/* A netlink socket always has a peer: the kernel's (port id 0), unless
 * connect() named another. */
static int unconnected_netlink(const struct ckpt_fd *rec)
{
	const struct sockaddr_nl *nl = (const void *)rec->sock_peer.addr;

	return rec->sock_domain == AF_NETLINK && !nl->nl_pid && !nl->nl_groups;
}

static void get_addresses(int s, struct ckpt_fd *rec)
{
	socklen_t len = sizeof(rec->sock_local.addr);

	if (net_real_getsockname(s, (struct sockaddr *)rec->sock_local.addr, &len) == 0)
		rec->sock_local.len = len;
	len = sizeof(rec->sock_peer.addr);
	if (net_real_getpeername(s, (struct sockaddr *)rec->sock_peer.addr, &len) == 0 &&
	    !unconnected_netlink(rec)) {
		rec->sock_peer.len = len;
		rec->sock_flags |= CKPT_SOCK_CONNECTED;
	}
	if (is_bound(rec))
		rec->sock_flags |= CKPT_SOCK_BOUND;
}

/*
 * socket()'s protocol.  A packet socket's is in its address (SO_PROTOCOL
 * says 0), and one bound to an interface keeps the interface's name in
 * path: its index may differ on another host.
 */
static int save_protocol(int s, struct ckpt_fd *rec, char *path, size_t path_size)
{
	const struct sockaddr_ll *ll = (const void *)rec->sock_local.addr;
	char name[IF_NAMESIZE];

	if (rec->sock_domain != AF_PACKET) {
		rec->sock_protocol = get_int(s, SOL_SOCKET, SO_PROTOCOL);
		return rec->sock_protocol < 0 ? errno : 0;
	}
	rec->sock_protocol = ll->sll_protocol;
	if (!ll->sll_ifindex)
		return 0;
	if (!if_indextoname(ll->sll_ifindex, name))
		return errno;
	snprintf(path, path_size, "%s", name);
	return 0;
}

/* Only Unix, TCP and UDP queues can be filled again (by a peer that sends
 * the bytes again); what an ICMP, raw, netlink or packet socket holds came
 * from the kernel or the network, which would not send it twice. */
static int queue_refillable(const struct ckpt_fd *rec)
{
	int ip = rec->sock_domain == AF_INET || rec->sock_domain == AF_INET6;

	return rec->sock_domain == AF_UNIX ||
	       (ip && (rec->sock_protocol == IPPROTO_TCP || rec->sock_protocol == IPPROTO_UDP));
}

static void warn_dropped_queue(int s, int fd)
{
	int inq = 0;

	if (!ioctl(s, FIONREAD, &inq) && inq > 0)
		ckpt_warn("fd %d: %d bytes queued on a socket that cannot be filled again "
			  "(ICMP, raw, netlink or packet) are dropped", fd, inq);
}

/* Kernels before 6.9 have no SO_PEEK_OFF for TCP: one peek of all that
 * is queued does for a stream; datagrams cannot be walked. */
/* What recv says on a stream socket never connected (TCP: ENOTCONN,
 * Unix: EINVAL): nothing is queued there. */
static int never_connected(int stream, int err)
{
	return stream && (err == ENOTCONN || err == EINVAL);
}

static int peek_without_offset(int s, int stream, struct fd_payload *q)
{
	int inq = 0;
	ssize_t n;

	if (!stream)
		return EOPNOTSUPP;
	if (ioctl(s, SIOCINQ, &inq) || inq <= 0)
		return 0;
	if ((size_t)inq > q->cap)
		return ENOBUFS;
	n = recv(s, q->data, inq, MSG_PEEK | MSG_DONTWAIT);
	if (n < 0)
		return errno == EAGAIN || never_connected(stream, errno) ? 0 : errno;
	q->len = n;
	return 0;
}

/*
 * recv(MSG_PEEK) of up to len bytes; *in_flight counts the file
 * descriptors sent with them (SCM_RIGHTS on a Unix socket).  A peek
 * installs copies of those in our table: closed at once.  They are not
 * saved: the bytes come back at restart, the descriptors do not.
 */
static ssize_t peek_counting_fds(int s, void *buf, size_t len, int *in_flight)
{
	char control[CMSG_SPACE(64 * sizeof(int))];
	struct iovec iov = { buf, len };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
			    .msg_controllen = sizeof(control) };
	ssize_t n = recvmsg(s, &m, MSG_PEEK | MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

	if (n < 0)
		return n;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		int nfds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		for (int i = 0; i < nfds; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
			close(fd);
		}
		*in_flight += nfds;
	}
	if (m.msg_flags & MSG_CTRUNC)	/* more than the room: at least one more */
		(*in_flight)++;
	return n;
}

/* Stream: the queued bytes.  Datagrams: each after its uint32_t length.
 * SO_PEEK_OFF walks the queue without consuming it. */
static int peek_queue(int s, int type, struct fd_payload *q, int *in_flight)
{
	int stream = type == SOCK_STREAM;
	int old_off = get_int(s, SOL_SOCKET, SO_PEEK_OFF);
	int zero = 0, err = 0;

	q->len = 0;
	/* queued bytes stay under SO_RCVBUF; datagrams take 4 more each */
	q->cap = 2 * (size_t)get_int(s, SOL_SOCKET, SO_RCVBUF) + DGRAM_MAX + 16;
	q->data = scratch_map(q->cap);
	if (!q->data)
		return ENOMEM;
	if (setsockopt(s, SOL_SOCKET, SO_PEEK_OFF, &zero, sizeof(zero)))
		return peek_without_offset(s, stream, q);
	for (;;) {
		size_t room = q->cap - q->len;
		ssize_t n;

		if (room < (stream ? 1 : DGRAM_MAX + 4)) {
			err = ENOBUFS;
			break;
		}
		n = peek_counting_fds(s, q->data + q->len + (stream ? 0 : 4),
				      stream ? room : DGRAM_MAX, in_flight);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno != EAGAIN && !never_connected(stream, errno))
			err = errno;
		if (n <= 0)
			break;
		if (!stream) {
			uint32_t len32 = n;

			memcpy(q->data + q->len, &len32, 4);
			n += 4;
		}
		q->len += n;
	}
	setsockopt(s, SOL_SOCKET, SO_PEEK_OFF, &old_off, sizeof(old_off));
	return err;
}

/* What is queued for the application: on a TCP connection inside the job,
 * what FLUSH read (the kernel's queue is empty then); else a peek. */
static int queued_bytes(int s, uint64_t ino, int type, struct fd_payload *q, int *in_flight)
{
	const char *flushed;
	size_t len;

	if (!tcp_flushed_queue(ino, &flushed, &len))
		return peek_queue(s, type, q, in_flight);
	*q = (struct fd_payload){ 0 };
	if (!len)
		return 0;
	q->cap = len;
	q->data = scratch_map(q->cap);
	if (!q->data)
		return ENOMEM;
	memcpy(q->data, flushed, len);
	q->len = len;
	return 0;
}

/*
 * TCP bytes still on their way (sent, not yet acknowledged) are in no
 * receive queue: wait until every receiver has them.  FLUSH empties the
 * connections inside the job; these lead outside or are half closed, so
 * a full receive buffer keeps their bytes out.
 */
#define TCP_SETTLE_MS 2000

static int tcp_unacked(int s)
{
	int outq = 0;

	if (get_int(s, SOL_SOCKET, SO_PROTOCOL) != IPPROTO_TCP || ioctl(s, SIOCOUTQ, &outq))
		return 0;
	return outq;
}

int sockets_settle(const int *fds, int nfds, char *why, size_t why_size)
{
	int64_t deadline = shim_now_ns() + TCP_SETTLE_MS * 1000000LL;

	for (int i = 0; i < nfds; i++) {
		int s = app_getfd(fds[i]);
		int left;

		if (s < 0)
			continue;
		while ((left = tcp_unacked(s)) > 0 && shim_now_ns() < deadline) {
			struct timespec ts = { 0, 1000000 };

			nanosleep(&ts, NULL);
		}
		close(s);
		if (left > 0) {
			snprintf(why, why_size, "fd %d: %d TCP bytes not taken by the receiver "
				 "(its buffer is full?)", fds[i], left);
			return EBUSY;
		}
	}
	return 0;
}

/* The job is about to die: its TCP connections end with a reset. */
void sockets_reset_on_close(const int *fds, int nfds)
{
	struct linger abortive = { .l_onoff = 1, .l_linger = 0 };

	for (int i = 0; i < nfds; i++) {
		int s = app_getfd(fds[i]);

		if (s < 0)
			continue;
		if (get_int(s, SOL_SOCKET, SO_PROTOCOL) == IPPROTO_TCP)
			setsockopt(s, SOL_SOCKET, SO_LINGER, &abortive, sizeof(abortive));
		close(s);
	}
}

static void add_option(struct ckpt_fd *rec, int level, int name, const void *v, socklen_t len)
{
	struct ckpt_sockopt *o = &rec->sock_opts[rec->nsock_opts++];

	o->level = level;
	o->name = name;
	o->len = len;
	memcpy(o->value, v, len);
}

/* A buffer size the application set: what it passed (the kernel doubles it). */
static void add_buffer_size(int s, struct ckpt_fd *rec, int name)
{
	int size = get_int(s, SOL_SOCKET, name) / 2;

	if (size > 0)
		add_option(rec, SOL_SOCKET, name, &size, sizeof(size));
}

/* The options in which s differs from a new socket of its kind. */
static void save_options(int s, uint64_t ino, struct ckpt_fd *rec)
{
	int fresh = socket(rec->sock_domain, rec->sock_type | SOCK_CLOEXEC, rec->sock_protocol);
	unsigned set = sockopt_buffers_set(ino);

	rec->nsock_opts = 0;
	for (unsigned i = 0; i < CKPT_NSOCKOPT_NAMES; i++) {
		const struct ckpt_sockopt_name *n = &ckpt_sockopt_names[i];
		uint8_t v[16], d[16];
		socklen_t vlen = sizeof(v), dlen = sizeof(d);

		if (getsockopt(s, n->level, n->name, v, &vlen))
			continue;
		if (fresh >= 0 && !getsockopt(fresh, n->level, n->name, d, &dlen) &&
		    dlen == vlen && !memcmp(v, d, vlen))
			continue;
		add_option(rec, n->level, n->name, v, vlen);
	}
	if (set & SOCKOPT_SET_SNDBUF)
		add_buffer_size(s, rec, SO_SNDBUF);
	if (set & SOCKOPT_SET_RCVBUF)
		add_buffer_size(s, rec, SO_RCVBUF);
	if (fresh >= 0)
		close(fresh);
}

/*
 * How far a TCP connection is closed, from its state.  A connection that ended (FINs both ways, or reset) is
 * CLOSE, as is a socket never connected: the segments it received tell.
 * An end's own SHUT_RD shows no state: with nothing queued, a peek says
 * EOF rather than EAGAIN.
 */

struct tcp_info_segs {		/* the kernel's, past glibc's end (Linux 4.2) */
	struct tcp_info base;
	uint64_t pacing_rate, max_pacing_rate, bytes_acked, bytes_received;
	uint32_t segs_out, segs_in;
};

static void tcp_shutdown_state(int s, struct ckpt_fd *rec)
{
	struct tcp_info_segs ti;
	socklen_t len = sizeof(ti);
	int inq = 0;
	char c;

	memset(&ti, 0, sizeof(ti));
	if (getsockopt(s, IPPROTO_TCP, TCP_INFO, &ti, &len))
		return;
	switch (ti.base.tcpi_state) {
	case TCP_FIN_WAIT1:
	case TCP_FIN_WAIT2:
		rec->sock_flags |= CKPT_SOCK_SHUT_WR;
		break;
	case TCP_CLOSE_WAIT:
		rec->sock_flags |= CKPT_SOCK_SHUT_RD | CKPT_SOCK_PEER_FIN;
		break;
	case TCP_LAST_ACK:
	case TCP_CLOSING:
	case TCP_TIME_WAIT:
		rec->sock_flags |= CKPT_SOCK_SHUT_WR | CKPT_SOCK_SHUT_RD | CKPT_SOCK_PEER_FIN;
		break;
	case TCP_CLOSE:
		/* a connect() refused got one segment: its RST */
		if (ti.segs_in >= 2)
			rec->sock_flags |= CKPT_SOCK_SHUT_WR | CKPT_SOCK_SHUT_RD | CKPT_SOCK_PEER_FIN;
		break;
	}
	if ((ti.base.tcpi_state == TCP_ESTABLISHED || ti.base.tcpi_state == TCP_FIN_WAIT1 ||
	     ti.base.tcpi_state == TCP_FIN_WAIT2) && !ioctl(s, SIOCINQ, &inq) && !inq &&
	    recv(s, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0)
		rec->sock_flags |= CKPT_SOCK_SHUT_RD;
}

static int payload_append(struct fd_payload *q, const void *p, size_t len)
{
	if (q->len + len > q->cap) {
		char *bigger = scratch_map(q->len + len);

		if (!bigger)
			return ENOMEM;
		if (q->len)
			memcpy(bigger, q->data, q->len);
		if (q->data)
			scratch_unmap(q->data, q->cap);
		q->data = bigger;
		q->cap = q->len + len;
	}
	memcpy(q->data + q->len, p, len);
	q->len += len;
	return 0;
}

/*
 * A classic BPF filter (SO_ATTACH_FILTER), as SO_GET_FILTER gives it back
 * (a count of instructions, then the instructions), after the queue in
 * the record's data; and whether SO_LOCK_FILTER locked it.  An eBPF
 * program (SO_ATTACH_BPF) cannot be read back: EACCES, and the socket is
 * not saved (the user is told), rather than restored unfiltered.
 */
static int save_filter(int s, struct ckpt_fd *rec, struct fd_payload *q)
{
	static struct sock_filter insns[CKPT_SOCK_FILTER_MAX];	/* the checkpoint thread's alone */
	socklen_t n = 0;

	if (getsockopt(s, SOL_SOCKET, SO_GET_FILTER, NULL, &n))
		return errno == EACCES ? EACCES : 0;	/* EACCES: eBPF */
	if (!n)
		return 0;
	if (n > CKPT_SOCK_FILTER_MAX || getsockopt(s, SOL_SOCKET, SO_GET_FILTER, insns, &n))
		return n > CKPT_SOCK_FILTER_MAX ? E2BIG : errno;
	rec->sock_filter_len = n;
	if (get_int(s, SOL_SOCKET, SO_LOCK_FILTER) == 1)
		rec->sock_flags |= CKPT_SOCK_FILTER_LOCKED;
	return payload_append(q, insns, n * sizeof(insns[0]));
}

/* Fills the socket fields of rec; q gets the receive queue; path, the
 * interface a packet socket is bound to. */
int socket_describe(int fd, uint64_t ino, struct ckpt_fd *rec, struct fd_payload *q,
		    char *path, size_t path_size)
{
	int s = app_getfd(fd);
	int err = 0, in_flight = 0;

	if (s < 0)
		return errno;
	rec->kind = CKPT_FD_SOCKET;
	rec->object_id = ino;
	rec->sock_domain = get_int(s, SOL_SOCKET, SO_DOMAIN);
	rec->sock_type = get_int(s, SOL_SOCKET, SO_TYPE);
	if (fd_left_outside(fd)) {
		close(s);	/* a plugin's own: restored unconnected, with nothing queued */
		return 0;
	}
	if (get_int(s, SOL_SOCKET, SO_ACCEPTCONN) == 1) {
		rec->sock_flags |= CKPT_SOCK_LISTENING;
		rec->sock_backlog = 128;
	}
	get_addresses(s, rec);	/* needs sock_domain */
	err = save_protocol(s, rec, path, path_size);
	if (err) {
		close(s);
		return err;
	}
	if (rec->sock_domain == AF_UNIX) {
		unsigned shut;

		unix_diag(ino, &rec->peer_id, &shut);
		/* the kernel's RCV_SHUTDOWN 1, SEND_SHUTDOWN 2 */
		rec->sock_flags |= (shut & 1 ? CKPT_SOCK_SHUT_RD : 0) |
				   (shut & 2 ? CKPT_SOCK_SHUT_WR : 0);
	}
	if ((rec->sock_domain == AF_INET || rec->sock_domain == AF_INET6) &&
	    rec->sock_type == SOCK_STREAM)
		tcp_shutdown_state(s, rec);
	if (rec->peer_id)
		rec->sock_flags |= CKPT_SOCK_CONNECTED;
	save_options(s, ino, rec);
	if (!queue_refillable(rec))
		warn_dropped_queue(s, fd);
	else if (!(rec->sock_flags & CKPT_SOCK_LISTENING))
		err = queued_bytes(s, ino, rec->sock_type, q, &in_flight);
	if (in_flight)
		ckpt_warn("fd %d: %d file descriptor(s) sent with its queued messages (SCM_RIGHTS) "
			  "are not saved: after restart the messages come without them", fd, in_flight);
	if (!err)
		err = save_filter(s, rec, q);
	if (err == EACCES) {
		ckpt_warn("fd %d: its socket filter is an eBPF program, which cannot be read back: "
			  "it will be /dev/null after restart", fd);
		err = ECANCELED;	/* said */
	}
	close(s);
	return err;
}
