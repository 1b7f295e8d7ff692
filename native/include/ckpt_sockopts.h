/*
 * The socket options a checkpoint keeps: the shim saves each one whose
 * value differs from a new socket's (the application changed it), and
 * ckpt-restart sets it again.  Buffer sizes are kept only when the
 * application set them: TCP grows an unset one by itself, and setting it
 * would stop that (see the shim's setsockopt wrapper).  Also how the shim
 * and ckpt-restart make room in a socket's buffers for a queue refilled
 * while nobody reads.
 */
#ifndef CKPT_SOCKOPTS_H
#define CKPT_SOCKOPTS_H

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>
#include "ckpt_image.h"

struct ckpt_sockopt_name {
	int level, name;
	const char *text;
};

#define CKPT_OPT(level, name) { level, name, #name }

static const struct ckpt_sockopt_name ckpt_sockopt_names[] = {
	CKPT_OPT(SOL_SOCKET, SO_KEEPALIVE),
	CKPT_OPT(SOL_SOCKET, SO_REUSEADDR),
	CKPT_OPT(SOL_SOCKET, SO_REUSEPORT),
	CKPT_OPT(SOL_SOCKET, SO_BROADCAST),
	CKPT_OPT(SOL_SOCKET, SO_DONTROUTE),
	CKPT_OPT(SOL_SOCKET, SO_OOBINLINE),
	CKPT_OPT(SOL_SOCKET, SO_PRIORITY),
	CKPT_OPT(SOL_SOCKET, SO_RCVLOWAT),
	CKPT_OPT(SOL_SOCKET, SO_LINGER),
	CKPT_OPT(SOL_SOCKET, SO_RCVTIMEO),
	CKPT_OPT(SOL_SOCKET, SO_SNDTIMEO),
	CKPT_OPT(SOL_SOCKET, SO_PASSCRED),
	CKPT_OPT(SOL_SOCKET, SO_TIMESTAMP),
	CKPT_OPT(SOL_SOCKET, SO_MARK),
	CKPT_OPT(IPPROTO_TCP, TCP_NODELAY),
	CKPT_OPT(IPPROTO_TCP, TCP_CORK),
	CKPT_OPT(IPPROTO_TCP, TCP_KEEPIDLE),
	CKPT_OPT(IPPROTO_TCP, TCP_KEEPINTVL),
	CKPT_OPT(IPPROTO_TCP, TCP_KEEPCNT),
	CKPT_OPT(IPPROTO_TCP, TCP_USER_TIMEOUT),
	CKPT_OPT(IPPROTO_TCP, TCP_DEFER_ACCEPT),
	CKPT_OPT(IPPROTO_TCP, TCP_NOTSENT_LOWAT),
	CKPT_OPT(IPPROTO_TCP, TCP_LINGER2),
	CKPT_OPT(IPPROTO_TCP, TCP_SYNCNT),
	CKPT_OPT(IPPROTO_IP, IP_TOS),
	CKPT_OPT(IPPROTO_IP, IP_TTL),
	CKPT_OPT(IPPROTO_IP, IP_RECVERR),
	CKPT_OPT(IPPROTO_IP, IP_PKTINFO),
	CKPT_OPT(IPPROTO_IP, IP_FREEBIND),	/* set before the bind again */
	CKPT_OPT(IPPROTO_IPV6, IPV6_V6ONLY),
	CKPT_OPT(IPPROTO_IPV6, IPV6_TCLASS),
	CKPT_OPT(IPPROTO_IPV6, IPV6_UNICAST_HOPS),
	CKPT_OPT(IPPROTO_IPV6, IPV6_RECVPKTINFO),
	CKPT_OPT(IPPROTO_IPV6, IPV6_FREEBIND),
};

#define CKPT_NSOCKOPT_NAMES (sizeof(ckpt_sockopt_names) / sizeof(ckpt_sockopt_names[0]))

/* SO_SNDBUF and SO_RCVBUF come on top of the table */
_Static_assert(CKPT_NSOCKOPT_NAMES + 2 <= CKPT_SOCK_OPTS, "CKPT_SOCK_OPTS too small");

/* The option's name for messages, or NULL. */
static inline const char *ckpt_sockopt_text(int level, int name)
{
	if (level == SOL_SOCKET && name == SO_SNDBUF)
		return "SO_SNDBUF";
	if (level == SOL_SOCKET && name == SO_RCVBUF)
		return "SO_RCVBUF";
	for (unsigned i = 0; i < CKPT_NSOCKOPT_NAMES; i++)
		if (ckpt_sockopt_names[i].level == level && ckpt_sockopt_names[i].name == name)
			return ckpt_sockopt_names[i].text;
	return NULL;
}

/* A number in /proc/sys, or 0. */
static inline long ckpt_sysctl(const char *path)
{
	char buf[32];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;

	if (fd >= 0)
		close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	return strtol(buf, NULL, 10);
}

/*
 * A socket buffer made to hold `bytes` (what SO_*BUF takes: the kernel
 * doubles it), never smaller than it is (TCP may have grown it):
 * SO_*BUFFORCE when we may, else SO_*BUF as far as net.core.[rw]mem_max
 * lets it go.  For queues refilled while nobody reads: the shim's RESUME
 * and ckpt-restart.
 */
static inline void ckpt_raise_socket_buffer(int s, int opt, uint64_t bytes)
{
	int force = opt == SO_SNDBUF ? SO_SNDBUFFORCE : SO_RCVBUFFORCE;
	int want = bytes < (1U << 29) ? (int)bytes : 1 << 29, now = 0;
	socklen_t len = sizeof(now);

	if (getsockopt(s, SOL_SOCKET, opt, &now, &len) || now >= 2 * want)
		return;
	if (setsockopt(s, SOL_SOCKET, force, &want, sizeof(want)) == 0)
		return;
	if (2 * ckpt_sysctl(opt == SO_SNDBUF ? "/proc/sys/net/core/wmem_max" :
			    "/proc/sys/net/core/rmem_max") > now)
		setsockopt(s, SOL_SOCKET, opt, &want, sizeof(want));
}

/* Room for `more` bytes more in s's send queue. */
static inline void ckpt_grow_send_buffer(int s, uint64_t more)
{
	int now = 0;
	socklen_t len = sizeof(now);

	if (!getsockopt(s, SOL_SOCKET, SO_SNDBUF, &now, &len))
		ckpt_raise_socket_buffer(s, SO_SNDBUF, (uint64_t)now / 2 + more);
}

#endif
