/*
 * Sockets of protocols other than Unix, TCP and UDP (root: raw and packet
 * sockets need CAP_NET_RAW, an ICMP "ping" socket a group within
 * net.ipv4.ping_group_range):
 *   - an ICMP echo socket (SOCK_DGRAM, IPPROTO_ICMP), its echo id chosen
 *     by the kernel at its first send;
 *   - a raw ICMP socket, which sees every echo reply;
 *   - a packet socket for IPv4 bound to lo, which sees them too;
 *   - a route netlink socket in the link multicast group, and a generic
 *     netlink one (a protocol other than the default).
 * Every step pings 127.0.0.1 with the step as sequence number and finds
 * the reply on the first three (a reply queued at a checkpoint is lost,
 * as on a network: the ping is sent again), and asks each netlink socket
 * what only its own protocol answers.  Each socket's protocol, echo id,
 * interface and groups must read back as they were.
 */
#include <arpa/inet.h>
#include <linux/genetlink.h>
#include <linux/if_packet.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/ip_icmp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include "zdtm.h"

#define ATTEMPTS 10
#define REPLY_WAIT_MS 300

struct sockets {
	int ping, raw, packet, route, generic;
	uint16_t echo_id;
	int lo;
};

static int protocol(int s)
{
	int v = -1;
	socklen_t len = sizeof(v);

	getsockopt(s, SOL_SOCKET, SO_PROTOCOL, &v, &len);
	return v;
}

static void send_ping(const struct sockets *k, uint16_t seq)
{
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct { struct icmphdr h; char payload[8]; } echo = {
		.h = { .type = ICMP_ECHO, .un.echo.sequence = htons(seq) },
		.payload = "ckpt-ok",
	};

	zdtm_check(sendto(k->ping, &echo, sizeof(echo), 0, (void *)&to, sizeof(to)) == sizeof(echo),
		   "ping %u: %s", seq, strerror(errno));
}

/* An echo reply with our id and seq at icmp (len bytes). */
static int is_our_reply(const struct sockets *k, const char *icmp, ssize_t len, uint16_t seq)
{
	const struct icmphdr *h = (const void *)icmp;

	return len >= (ssize_t)sizeof(*h) + 8 && h->type == ICMP_ECHOREPLY &&
	       ntohs(h->un.echo.id) == k->echo_id && ntohs(h->un.echo.sequence) == seq &&
	       !memcmp(icmp + sizeof(*h), "ckpt-ok", 8);
}

/* Until the reply to seq shows on s (skip: bytes before the ICMP header,
 * -1: an IP header of its own length); 0 if it does not come in time. */
static int await_reply(const struct sockets *k, int s, int skip, uint16_t seq)
{
	struct pollfd pfd = { .fd = s, .events = POLLIN };
	char buf[2048];

	while (poll(&pfd, 1, REPLY_WAIT_MS) == 1) {
		ssize_t n = recv(s, buf, sizeof(buf), MSG_DONTWAIT);
		int at = skip >= 0 ? skip : (buf[0] & 0x0f) * 4;

		if (n < 0 && errno == EAGAIN)
			continue;
		zdtm_check(n >= 0, "recv: %s", strerror(errno));
		if (n > at && (skip == 0 || ((const struct iphdr *)buf)->protocol == IPPROTO_ICMP) &&
		    is_our_reply(k, buf + at, n - at, seq))
			return 1;
	}
	return 0;
}

/* The reply on every socket that sees it; pings again if one is lost. */
static void ping_step(const struct sockets *k, uint16_t seq)
{
	for (int attempt = 0; attempt < ATTEMPTS; attempt++) {
		send_ping(k, seq);
		if (await_reply(k, k->ping, 0, seq) && await_reply(k, k->raw, -1, seq) &&
		    await_reply(k, k->packet, -1, seq))
			return;
	}
	zdtm_fail("ping %u: no reply on every socket in %d attempts", seq, ATTEMPTS);
}

/* One request and its first reply message. */
static struct nlmsghdr *ask(int s, struct nlmsghdr *req, char *buf, size_t size)
{
	struct pollfd pfd = { .fd = s, .events = POLLIN };
	ssize_t n;

	zdtm_check(send(s, req, req->nlmsg_len, 0) == (ssize_t)req->nlmsg_len, "netlink send: %s",
		   strerror(errno));
	zdtm_check(poll(&pfd, 1, 5000) == 1, "netlink: no answer");
	n = recv(s, buf, size, 0);
	zdtm_check(n >= (ssize_t)sizeof(struct nlmsghdr), "netlink recv: %s", strerror(errno));
	return (struct nlmsghdr *)buf;
}

/* Route netlink: lo's link, by index. */
static void ask_route(const struct sockets *k, uint32_t seq)
{
	struct { struct nlmsghdr h; struct ifinfomsg i; } req = {
		.h = { .nlmsg_len = sizeof(req), .nlmsg_type = RTM_GETLINK,
		       .nlmsg_flags = NLM_F_REQUEST, .nlmsg_seq = seq },
		.i = { .ifi_family = AF_UNSPEC, .ifi_index = k->lo },
	};
	char buf[8192];
	struct nlmsghdr *h = ask(k->route, &req.h, buf, sizeof(buf));
	struct ifinfomsg *i = NLMSG_DATA(h);

	zdtm_check(h->nlmsg_type == RTM_NEWLINK && h->nlmsg_seq == seq && i->ifi_index == k->lo,
		   "route netlink: answer type %u seq %u (want RTM_NEWLINK of lo)", h->nlmsg_type,
		   h->nlmsg_seq);
}

/* Generic netlink: the controller's own family (only this protocol knows it). */
static void ask_generic(const struct sockets *k, uint32_t seq)
{
	struct {
		struct nlmsghdr h;
		struct genlmsghdr g;
		struct nlattr a;
		char name[8];
	} req = {
		.h = { .nlmsg_len = sizeof(req), .nlmsg_type = GENL_ID_CTRL,
		       .nlmsg_flags = NLM_F_REQUEST, .nlmsg_seq = seq },
		.g = { .cmd = CTRL_CMD_GETFAMILY, .version = 1 },
		.a = { .nla_len = NLA_HDRLEN + 7, .nla_type = CTRL_ATTR_FAMILY_NAME },
		.name = "nlctrl",
	};
	char buf[8192];
	struct nlmsghdr *h = ask(k->generic, &req.h, buf, sizeof(buf));
	struct genlmsghdr *g = NLMSG_DATA(h);

	zdtm_check(h->nlmsg_type == GENL_ID_CTRL && h->nlmsg_seq == seq &&
		   g->cmd == CTRL_CMD_NEWFAMILY,
		   "generic netlink: answer type %u seq %u (want the controller's family)",
		   h->nlmsg_type, h->nlmsg_seq);
}

static uint16_t echo_id(int s)
{
	struct sockaddr_in a;
	socklen_t len = sizeof(a);

	zdtm_check(getsockname(s, (void *)&a, &len) == 0, "getsockname: %s", strerror(errno));
	return ntohs(a.sin_port);
}

/* Each socket still what it was. */
static void check_kinds(const struct sockets *k, long step)
{
	struct sockaddr_ll ll;
	struct sockaddr_nl nl;
	socklen_t len = sizeof(ll);

	zdtm_check(protocol(k->ping) == IPPROTO_ICMP, "step %ld: the ICMP socket's protocol is %d",
		   step, protocol(k->ping));
	zdtm_check(echo_id(k->ping) == k->echo_id, "step %ld: echo id %u, was %u", step,
		   echo_id(k->ping), k->echo_id);
	zdtm_check(protocol(k->raw) == IPPROTO_ICMP, "step %ld: the raw socket's protocol is %d",
		   step, protocol(k->raw));
	zdtm_check(getsockname(k->packet, (void *)&ll, &len) == 0 && ll.sll_family == AF_PACKET &&
		   ll.sll_ifindex == k->lo && ll.sll_protocol == htons(ETH_P_IP),
		   "step %ld: the packet socket is not bound to lo for IPv4", step);
	len = sizeof(nl);
	zdtm_check(getsockname(k->route, (void *)&nl, &len) == 0 && nl.nl_family == AF_NETLINK &&
		   nl.nl_groups == RTMGRP_LINK,
		   "step %ld: the route netlink socket left its group (groups %x)", step, nl.nl_groups);
	zdtm_check(protocol(k->generic) == NETLINK_GENERIC,
		   "step %ld: the generic netlink socket's protocol is %d", step, protocol(k->generic));
}

static void open_sockets(struct sockets *k)
{
	struct sockaddr_nl groups = { .nl_family = AF_NETLINK, .nl_groups = RTMGRP_LINK };
	struct sockaddr_ll ll = { .sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_IP) };

	k->ping = socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP);
	zdtm_check(k->ping >= 0, "ICMP socket: %s (net.ipv4.ping_group_range?)", strerror(errno));
	k->raw = socket(AF_INET, SOCK_RAW, IPPROTO_ICMP);
	zdtm_check(k->raw >= 0, "raw socket: %s", strerror(errno));
	k->packet = socket(AF_PACKET, SOCK_DGRAM, htons(ETH_P_IP));
	zdtm_check(k->packet >= 0, "packet socket: %s", strerror(errno));
	k->lo = if_nametoindex("lo");
	ll.sll_ifindex = k->lo;
	zdtm_check(bind(k->packet, (void *)&ll, sizeof(ll)) == 0, "bind to lo: %s", strerror(errno));
	k->route = socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE);
	zdtm_check(k->route >= 0 && bind(k->route, (void *)&groups, sizeof(groups)) == 0,
		   "route netlink: %s", strerror(errno));
	k->generic = socket(AF_NETLINK, SOCK_RAW, NETLINK_GENERIC);
	zdtm_check(k->generic >= 0, "generic netlink: %s", strerror(errno));
}

int main(int argc, char **argv)
{
	long steps = 200, pace = 10;
	uint64_t hash = 0;
	struct sockets k;

	zdtm_args(argc, argv, &steps, &pace);
	open_sockets(&k);
	send_ping(&k, 0xffff);	/* the kernel picks the echo id */
	k.echo_id = echo_id(k.ping);
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		check_kinds(&k, step);
		ping_step(&k, (uint16_t)step);
		ask_route(&k, step);
		ask_generic(&k, step);
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	zdtm_hold();
	check_kinds(&k, steps);	/* once more: a restart during the hold too */
	ping_step(&k, (uint16_t)steps);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
