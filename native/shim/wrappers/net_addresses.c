/*
 * Virtual IPv4 addresses.  A restart on other hosts gives the job's hosts
 * new addresses, but the application keeps the old ones: MPI libraries
 * exchange their peers' addresses at start-up and connect lazily, at the
 * first message to a peer.  So, as with InfiniBand ids, the application
 * sees only the addresses of its first run ("virtual"), and these wrappers
 * translate: connect, bind and sendto/sendmsg take a virtual address to the
 * real one, getsockname, getpeername, accept and recvfrom give back the
 * virtual one.  The table (virtual -> real, only hosts that moved) grows
 * with each restart from ckpt-restart's list (ckpt_restart_info); with no
 * move every wrapper is a direct call.
 *
 * The shim's own socket code (sockets.c, socket_peers.c) works on real
 * addresses: net_real_getsockname/getpeername are raw system calls.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "shim.h"

static struct ckpt_addr_move moves[CKPT_ADDR_MOVES_MAX];	/* virtual -> real */
static unsigned nmoves;

static uint32_t moved_to(const struct ckpt_addr_move *moved, unsigned n, uint32_t addr)
{
	for (unsigned i = 0; i < n; i++)
		if (moved[i].from == addr)
			return moved[i].to;
	return addr;
}

static int in_table(uint32_t addr, int virtual_side)
{
	for (unsigned k = 0; k < nmoves; k++)
		if ((virtual_side ? moves[k].from : moves[k].to) == addr)
			return 1;
	return 0;
}

/* Called by the checkpoint thread after a restart, application parked.
 * moved: real address before -> real address now.  Every virtual address
 * follows its real one; an address of the first run that had not moved
 * yet (its real address was itself) joins the table. */
void net_addresses_restarted(const struct ckpt_addr_move *moved, unsigned n)
{
	if (n > CKPT_ADDR_MOVES_MAX)
		n = CKPT_ADDR_MOVES_MAX;
	for (unsigned i = 0; i < n; i++)
		if (!in_table(moved[i].from, 1) && !in_table(moved[i].from, 0) &&
		    nmoves < CKPT_ADDR_MOVES_MAX)
			moves[nmoves++] = (struct ckpt_addr_move){ moved[i].from, moved[i].from };
	for (unsigned k = 0; k < nmoves; k++)
		moves[k].to = moved_to(moved, n, moves[k].to);
}

static uint32_t *ipv4_in(const struct sockaddr *sa, socklen_t len)
{
	struct sockaddr_in *in = (void *)sa;
	struct sockaddr_in6 *in6 = (void *)sa;

	if (!sa)
		return NULL;
	if (len >= sizeof(*in) && in->sin_family == AF_INET)
		return &in->sin_addr.s_addr;
	if (len >= sizeof(*in6) && in6->sin6_family == AF_INET6 &&
	    IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr))
		return (uint32_t *)&in6->sin6_addr.s6_addr[12];
	return NULL;
}

/* sa translated into copy if it names a moved address, else sa itself. */
static const struct sockaddr *to_real(const struct sockaddr *sa, socklen_t len,
				      struct sockaddr_storage *copy)
{
	const uint32_t *ip = ipv4_in(sa, len);

	for (unsigned i = 0; ip && i < nmoves; i++)
		if (*ip == moves[i].from && len <= sizeof(*copy)) {
			memcpy(copy, sa, len);
			*ipv4_in((struct sockaddr *)copy, len) = moves[i].to;
			return (struct sockaddr *)copy;
		}
	return sa;
}

static void to_virtual(struct sockaddr *sa, const socklen_t *len)
{
	uint32_t *ip = len ? ipv4_in(sa, *len) : NULL;

	for (unsigned i = 0; ip && i < nmoves; i++)
		if (*ip == moves[i].to) {
			*ip = moves[i].from;
			return;
		}
}

int net_real_getsockname(int s, struct sockaddr *sa, socklen_t *len)
{
	return syscall(SYS_getsockname, s, sa, len);
}

int net_real_getpeername(int s, struct sockaddr *sa, socklen_t *len)
{
	return syscall(SYS_getpeername, s, sa, len);
}

#define REAL(type, name)						\
	static type real_;						\
	if (!real_)							\
		real_ = (type)dlsym(RTLD_NEXT, name)

typedef int (*addr_call_fn)(int, const struct sockaddr *, socklen_t);
typedef int (*name_call_fn)(int, struct sockaddr *, socklen_t *);

SHIM_EXPORT int connect(int s, const struct sockaddr *sa, socklen_t len)
{
	struct sockaddr_storage copy;
	REAL(addr_call_fn, "connect");

	return real_(s, nmoves ? to_real(sa, len, &copy) : sa, len);
}

SHIM_EXPORT int bind(int s, const struct sockaddr *sa, socklen_t len)
{
	struct sockaddr_storage copy;
	REAL(addr_call_fn, "bind");

	return real_(s, nmoves ? to_real(sa, len, &copy) : sa, len);
}

SHIM_EXPORT ssize_t sendto(int s, const void *buf, size_t n, int flags,
			   const struct sockaddr *sa, socklen_t len)
{
	typedef ssize_t (*fn)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
	struct sockaddr_storage copy;
	REAL(fn, "sendto");

	return real_(s, buf, n, flags, nmoves ? to_real(sa, len, &copy) : sa, len);
}

SHIM_EXPORT ssize_t sendmsg(int s, const struct msghdr *msg, int flags)
{
	typedef ssize_t (*fn)(int, const struct msghdr *, int);
	struct sockaddr_storage copy;
	struct msghdr moved;
	REAL(fn, "sendmsg");

	if (!nmoves || !msg->msg_name)
		return real_(s, msg, flags);
	moved = *msg;
	moved.msg_name = (void *)to_real(msg->msg_name, msg->msg_namelen, &copy);
	return real_(s, &moved, flags);
}

SHIM_EXPORT int getsockname(int s, struct sockaddr *sa, socklen_t *len)
{
	REAL(name_call_fn, "getsockname");
	int r = real_(s, sa, len);

	if (!r && nmoves)
		to_virtual(sa, len);
	return r;
}

SHIM_EXPORT int getpeername(int s, struct sockaddr *sa, socklen_t *len)
{
	REAL(name_call_fn, "getpeername");
	int r = real_(s, sa, len);

	if (!r && nmoves)
		to_virtual(sa, len);
	return r;
}

/* A connection the checkpoint took from the listener's backlog
 * (backlog.c) comes first: 1 and *r set, else 0. */
static int taken_first(int s, struct sockaddr *sa, socklen_t *len, int flags, int *r)
{
	if (!backlog_accept(s, flags, r))
		return 0;
	if (*r >= 0 && sa)
		getpeername(*r, sa, len);
	return 1;
}

SHIM_EXPORT int accept(int s, struct sockaddr *sa, socklen_t *len)
{
	REAL(name_call_fn, "accept");
	int r, taken;

	backlog_accept_begin();
	while (!(taken = taken_first(s, sa, len, 0, &r)) &&
	       (r = real_(s, sa, len)) >= 0 && backlog_was_token(s, r))
		;
	backlog_accept_end();
	if (!taken && r >= 0 && nmoves && sa)
		to_virtual(sa, len);
	return r;
}

SHIM_EXPORT int accept4(int s, struct sockaddr *sa, socklen_t *len, int flags)
{
	typedef int (*fn)(int, struct sockaddr *, socklen_t *, int);
	REAL(fn, "accept4");
	int r, taken;

	backlog_accept_begin();
	while (!(taken = taken_first(s, sa, len, flags, &r)) &&
	       (r = real_(s, sa, len, flags)) >= 0 && backlog_was_token(s, r))
		;
	backlog_accept_end();
	if (!taken && r >= 0 && nmoves && sa)
		to_virtual(sa, len);
	return r;
}

SHIM_EXPORT ssize_t recvfrom(int s, void *buf, size_t n, int flags, struct sockaddr *sa,
			     socklen_t *len)
{
	typedef ssize_t (*fn)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
	REAL(fn, "recvfrom");
	ssize_t r = real_(s, buf, n, flags, sa, len);

	if (r >= 0 && nmoves && sa)
		to_virtual(sa, len);
	return r;
}
