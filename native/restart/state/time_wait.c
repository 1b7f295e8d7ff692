/*
 * A port held by TIME_WAIT: the connections of a job that ended on this
 * host a moment ago (often the job being restarted) keep their local port
 * for a minute, and when the socket that accepted them had no
 * SO_REUSEADDR, nobody may bind that port again until then, SO_REUSEADDR
 * or not.  With CAP_NET_ADMIN over the network namespace (root, where
 * ckpt-restart makes no user namespace) those TIME_WAIT entries are ended
 * as `ss -K` ends them (SOCK_DESTROY); without it the caller waits.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include "restart.h"

#define MAX_ENDED 1024

struct diag_request {
	struct nlmsghdr nlh;
	struct inet_diag_req_v2 r;
};

/* Whether a TIME_WAIT entry holds the port (and address, unless the
 * wildcard) of local. */
static int holds(const struct inet_diag_msg *m, const struct sockaddr *local)
{
	if (local->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)local;

		return m->id.idiag_sport == in->sin_port &&
		       (in->sin_addr.s_addr == INADDR_ANY || m->id.idiag_src[0] == in->sin_addr.s_addr);
	}
	const struct sockaddr_in6 *in6 = (const void *)local;

	return m->id.idiag_sport == in6->sin6_port &&
	       (IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr) ||
		!memcmp(m->id.idiag_src, &in6->sin6_addr, 16));
}

/* The ids of the TIME_WAIT entries of one family holding local's port. */
static unsigned find_time_wait(int nl, int family, const struct sockaddr *local,
			       struct inet_diag_sockid *ids, unsigned max)
{
	struct diag_request req = {
		.nlh = { .nlmsg_len = sizeof(req), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
			 .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP },
		.r = { .sdiag_family = family, .sdiag_protocol = IPPROTO_TCP,
		       .idiag_states = 1 << TCP_TIME_WAIT },
	};
	static char buf[32768];
	unsigned n = 0;

	if (send(nl, &req, sizeof(req), 0) != sizeof(req))
		return 0;
	for (;;) {
		ssize_t len = recv(nl, buf, sizeof(buf), 0);
		struct nlmsghdr *h = (struct nlmsghdr *)buf;

		if (len <= 0)
			return n;
		for (; NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
			const struct inet_diag_msg *m = NLMSG_DATA(h);

			if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR)
				return n;
			if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY && n < max && holds(m, local))
				ids[n++] = m->id;
		}
	}
}

/* SOCK_DESTROY one entry: 0, or -errno (EPERM without CAP_NET_ADMIN). */
static int end_one(int nl, int family, const struct inet_diag_sockid *id)
{
	struct diag_request req = {
		.nlh = { .nlmsg_len = sizeof(req), .nlmsg_type = SOCK_DESTROY,
			 .nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK },
		.r = { .sdiag_family = family, .sdiag_protocol = IPPROTO_TCP,
		       .idiag_states = 1 << TCP_TIME_WAIT, .id = *id },
	};
	char buf[512];
	struct nlmsghdr *h = (struct nlmsghdr *)buf;
	ssize_t len;

	if (send(nl, &req, sizeof(req), 0) != sizeof(req))
		return -errno;
	len = recv(nl, buf, sizeof(buf), 0);
	if (len < (ssize_t)sizeof(*h) || h->nlmsg_type != NLMSG_ERROR)
		return -EIO;
	return ((struct nlmsgerr *)NLMSG_DATA(h))->error;
}

/* How many TIME_WAIT entries holding local's port were ended, or -errno. */
int end_time_wait(const struct sockaddr *local)
{
	static struct inet_diag_sockid ids[MAX_ENDED];
	/* an IPv6 wildcard also conflicts with the IPv4 entries */
	int families[2] = { local->sa_family, local->sa_family == AF_INET6 ? AF_INET : 0 };
	int nl, ended = 0, err = 0;

	if (local->sa_family != AF_INET && local->sa_family != AF_INET6)
		return -EAFNOSUPPORT;
	nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (nl < 0)
		return -errno;
	for (int f = 0; f < 2 && families[f] && !err; f++) {
		const struct sockaddr_in6 *in6 = (const void *)local;
		struct sockaddr_in any4 = { .sin_family = AF_INET };
		const struct sockaddr *match = local;
		unsigned n;

		if (families[f] != local->sa_family) {	/* v4 entries of a v6 wildcard */
			if (!IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr))
				continue;
			any4.sin_port = in6->sin6_port;
			match = (const struct sockaddr *)&any4;
		}
		n = find_time_wait(nl, families[f], match, ids, MAX_ENDED);
		for (unsigned i = 0; i < n && !err; i++) {
			err = end_one(nl, families[f], &ids[i]);
			ended += !err;
			if (err == -ENOENT)	/* it ended by itself meanwhile */
				err = 0;
		}
	}
	close(nl);
	return err && !ended ? err : ended;
}
