/*
 * Connections in a listener's backlog, not accept()ed yet.  Their bytes
 * sit in a socket no process has, which nothing can read without taking
 * it from the listener, and a restart could not put back.  So at DRAIN a
 * parked thread of the application accept()s them (its fd table, which
 * the checkpoint thread does not share): each becomes an ordinary
 * connection of the job, which the checkpoint saves and a restart
 * reconnects and refills like any other.  The shim keeps them, in order,
 * at fds of its own, and its accept() hands them out first.
 *
 * A "token" stands in for each in the backlog: a connection of the shim's
 * to the same listener, so that poll and epoll still see the listener
 * ready.  accept() takes one token off the backlog for each connection it
 * hands out, but only when no other thread can be in the kernel's accept
 * (a token it takes there would leave us blocked in accept): else the
 * token stays, and whichever accept() gets it drops it and accepts again.
 * A token accepted at a later DRAIN is dropped and made again.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>
#include "shim.h"

#define MAX_TAKEN 256
#define MAX_LISTENERS 64
#define HIGH_FD_MAX 512		/* the restart needs room above the highest */

struct taken_conn {
	int listener;		/* the application's fd */
	uint64_t listener_ino;
	int fd;			/* the accepted connection, ours until accept() */
};

struct token {
	int listener;
	uint64_t listener_ino;
	int fd;			/* our end; the other is in the listener's backlog */
};

static struct taken_conn taken[MAX_TAKEN];
static int ntaken;
static struct token tokens[MAX_TAKEN];
static int ntokens;
static atomic_flag taken_lock = ATOMIC_FLAG_INIT;
/* threads inside accept() (backlog_accept_begin/end): the kernel's accept
 * of another thread may take a token before we do */
static atomic_int accepting;

/* Never parked while holding it: the parked thread may be the one that
 * takes the backlogs (take_in_app). */
static void lock(uint64_t *old)
{
	uint64_t ckpt = 1ULL << (CKPT_SIGNAL - 1);

	syscall(SYS_rt_sigprocmask, SIG_BLOCK, &ckpt, old, sizeof(*old));
	while (atomic_flag_test_and_set(&taken_lock))
		syscall(SYS_sched_yield);
}

static void unlock(const uint64_t *old)
{
	atomic_flag_clear(&taken_lock);
	syscall(SYS_rt_sigprocmask, SIG_SETMASK, old, NULL, sizeof(*old));
}

static uint64_t inode_of(int fd)
{
	struct stat st;

	return fstat(fd, &st) ? 0 : st.st_ino;
}

/* Out of the way of the numbers the application opens next. */
static int move_high(int fd)
{
	struct rlimit rl;
	int base = HIGH_FD_MAX, high;

	if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur / 2 < HIGH_FD_MAX)
		base = rl.rlim_cur / 2;
	high = fcntl(fd, F_DUPFD_CLOEXEC, base);
	if (high < 0)
		return fd;
	close(fd);
	return high;
}

static int same_sockaddr(const struct sockaddr_storage *a, socklen_t alen,
			 const struct sockaddr_storage *b, socklen_t blen)
{
	return alen == blen && !memcmp(a, b, alen);
}

/* Is accepted the listener's end of our token's connection? */
static int is_token_end(int accepted, int token)
{
	struct sockaddr_storage peer, local;
	socklen_t plen = sizeof(peer), llen = sizeof(local);
	int domain = 0;
	socklen_t dlen = sizeof(domain);

	if (getsockopt(token, SOL_SOCKET, SO_DOMAIN, &domain, &dlen))
		return 0;
	if (domain == AF_UNIX)
		return socket_unix_peer(inode_of(token)) == inode_of(accepted);
	memset(&peer, 0, sizeof(peer));
	memset(&local, 0, sizeof(local));
	return !net_real_getpeername(accepted, (struct sockaddr *)&peer, &plen) &&
	       !net_real_getsockname(token, (struct sockaddr *)&local, &llen) &&
	       same_sockaddr(&peer, plen, &local, llen);
}

static void forget_token(int t)
{
	close(tokens[t].fd);
	tokens[t] = tokens[--ntokens];
}

/* accepted is one of our tokens of listener: it and the token are closed
 * (1), else 0. */
static int drop_if_token(int listener, int accepted)
{
	for (int t = 0; t < ntokens; t++)
		if (tokens[t].listener == listener && is_token_end(accepted, tokens[t].fd)) {
			close(accepted);
			forget_token(t);
			return 1;
		}
	return 0;
}

static int tokens_of(int listener)
{
	int n = 0;

	for (int t = 0; t < ntokens; t++)
		n += tokens[t].listener == listener;
	return n;
}

static int taken_of(int listener)
{
	int n = 0;

	for (int i = 0; i < ntaken; i++)
		n += taken[i].listener == listener;
	return n;
}

/* A new connection to listener, from the shim: the listener's address,
 * its wildcard made loopback. */
static int make_token(int listener)
{
	struct sockaddr_storage at;
	struct sockaddr_in *in = (struct sockaddr_in *)&at;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&at;
	socklen_t len = sizeof(at);
	int s;

	memset(&at, 0, sizeof(at));
	if (net_real_getsockname(listener, (struct sockaddr *)&at, &len))
		return -1;
	if (at.ss_family == AF_INET && in->sin_addr.s_addr == htonl(INADDR_ANY))
		in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (at.ss_family == AF_INET6 && IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr))
		in6->sin6_addr = in6addr_loopback;
	s = socket(at.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -1;
	/* the backlog has room: we just emptied it */
	if (syscall(SYS_connect, s, &at, len)) {
		close(s);
		return -1;
	}
	return move_high(s);
}

/* Everything in listener's backlog, without blocking (every thread of the
 * application is parked); how many had to be dropped for want of room. */
static int drain_listener(int listener)
{
	int dropped = 0;

	int flags = fcntl(listener, F_GETFL);
	uint64_t ino = inode_of(listener);

	if (flags < 0 || (!(flags & O_NONBLOCK) && fcntl(listener, F_SETFL, flags | O_NONBLOCK)))
		return 0;
	for (;;) {
		int a = syscall(SYS_accept4, listener, NULL, NULL, SOCK_CLOEXEC);

		if (a < 0)
			break;
		if (drop_if_token(listener, a))	/* made again below */
			continue;
		if (ntaken < MAX_TAKEN) {
			taken[ntaken++] = (struct taken_conn){ listener, ino, move_high(a) };
		} else {
			dropped++;
			close(a);
		}
	}
	if (!(flags & O_NONBLOCK))
		fcntl(listener, F_SETFL, flags);
	for (int n = tokens_of(listener); n < taken_of(listener) && ntokens < MAX_TAKEN; n++) {
		int fd = make_token(listener);

		if (fd < 0)
			break;
		tokens[ntokens++] = (struct token){ listener, ino, fd };
	}
	return dropped;
}

struct listeners {
	int n;
	int fd[MAX_LISTENERS];
	int dropped[MAX_LISTENERS];
};

/* In a parked thread of the application (quiesce_run_in_app): raw work
 * only, no messages (the coordinator's connection is not in its table). */
static void take_in_app(void *arg)
{
	struct listeners *l = arg;
	uint64_t old;

	lock(&old);
	for (int i = 0; i < l->n; i++)
		l->dropped[i] = drain_listener(l->fd[i]);
	unlock(&old);
}

static int is_stream_listener(int fd)
{
	int s = app_getfd(fd), listening = 0, type = 0;
	socklen_t len = sizeof(int);

	if (s < 0)
		return 0;
	if (getsockopt(s, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len))
		listening = 0;
	len = sizeof(int);
	getsockopt(s, SOL_SOCKET, SO_TYPE, &type, &len);
	close(s);
	return listening && type == SOCK_STREAM;
}

/*
 * A listener several processes hold (mpirun's, inherited by its ranks) is
 * left alone: a process that took its connections would keep them from
 * the others, which may be the ones that accept (and two processes taking
 * at once race on the shared O_NONBLOCK).  At SUSPEND each holder claims
 * "backlog:<checkpoint>:<host>:<inode>"; a second one marks it shared.
 */
static void holder_key(char *key, size_t size, unsigned seq, int fd)
{
	int s = app_getfd(fd);

	snprintf(key, size, "backlog:%u:%s:%llu", seq, shim_hostname(),
		 (unsigned long long)(s >= 0 ? inode_of(s) : 0));
	if (s >= 0)
		close(s);
}

int backlog_note_holders(unsigned seq, const int *socks, int n)
{
	char key[200], shared[210];

	for (int i = 0; i < n; i++) {
		if (!is_stream_listener(socks[i]))
			continue;
		holder_key(key, sizeof(key), seq, socks[i]);
		if (kv_claim_mine(key))
			continue;
		snprintf(shared, sizeof(shared), "%s:shared", key);
		kv_claim_mine(shared);
	}
	return 0;
}

static int held_alone(unsigned seq, int fd)
{
	char key[200], shared[210], owner[16];

	holder_key(key, sizeof(key), seq, fd);
	snprintf(shared, sizeof(shared), "%s:shared", key);
	return ckpt_kv_get(shared, owner, sizeof(owner)) == ENOENT;
}

static int is_ready(int fd)
{
	struct pollfd p = { .fd = app_getfd(fd), .events = POLLIN };
	int ready = p.fd >= 0 && syscall(SYS_poll, &p, 1, 0) == 1;

	if (p.fd >= 0)
		close(p.fd);
	return ready;
}

/* DRAIN, in the checkpoint thread: the backlogs of listeners this process
 * alone holds, taken. */
int backlog_take(unsigned seq, const int *socks, int n)
{
	struct listeners l = { 0 };
	int err;

	for (int i = 0; i < n && l.n < MAX_LISTENERS; i++) {
		if (!is_stream_listener(socks[i]))
			continue;
		if (held_alone(seq, socks[i]))
			l.fd[l.n++] = socks[i];
		else if (is_ready(socks[i]))
			ckpt_warn("fd %d: a listener shared with other processes has connections not "
				  "accepted yet: a restart from this checkpoint loses them", socks[i]);
	}
	if (!l.n)
		return 0;
	err = quiesce_run_in_app(take_in_app, &l);
	if (err)
		ckpt_hook_fail("cannot take the connections waiting on listeners: %s",
			       shim_strerror(err));
	for (int i = 0; !err && i < l.n; i++)
		if (l.dropped[i])
			ckpt_warn("fd %d: more than %d connections not accepted yet: %d dropped",
				  l.fd[i], MAX_TAKEN, l.dropped[i]);
	return err;
}

static void forget(int i)
{
	memmove(&taken[i], &taken[i + 1], sizeof(taken[0]) * (ntaken - i - 1));
	ntaken--;
}

/* Whether the listener fd whose inode was *seen is another file now (it
 * was closed since); after a restart (*seen 0) it is the new listener. */
static int listener_replaced(uint64_t *seen, uint64_t ino)
{
	if (!*seen)
		*seen = ino;
	return *seen != ino;
}

/* Connections and tokens of a listener fd that was closed since go. */
static void forget_closed(int listener, uint64_t ino)
{
	for (int i = 0; i < ntaken; i++)
		if (taken[i].listener == listener && listener_replaced(&taken[i].listener_ino, ino)) {
			close(taken[i].fd);
			forget(i--);
		}
	for (int t = 0; t < ntokens; t++)
		if (tokens[t].listener == listener && listener_replaced(&tokens[t].listener_ino, ino))
			forget_token(t--);
}

static int first_of(int listener)
{
	for (int i = 0; i < ntaken; i++)
		if (taken[i].listener == listener)
			return i;
	return -1;
}

/*
 * One token of listener off its backlog, now that a connection of it goes
 * (the caller holds the lock).  Only when this thread is the only one in
 * accept(): another one could take the token first and leave our accept
 * waiting.  What is accepted instead of a token is a new connection: it
 * waits after ours, its place taken by the token left in the backlog.
 */
static void consume_token(int listener)
{
	struct pollfd p = { .fd = listener, .events = POLLIN };
	int a;

	if (atomic_load(&accepting) > 1 || syscall(SYS_poll, &p, 1, 0) != 1)
		return;
	a = syscall(SYS_accept4, listener, NULL, NULL, SOCK_CLOEXEC);
	if (a < 0 || drop_if_token(listener, a))
		return;
	if (ntaken < MAX_TAKEN)
		taken[ntaken++] = (struct taken_conn){ listener, inode_of(listener), move_high(a) };
	else
		close(a);
}

/* RESUME after a restart: the listeners are new files. */
void backlog_restarted(void)
{
	for (int i = 0; i < ntaken; i++)
		taken[i].listener_ino = 0;
	for (int t = 0; t < ntokens; t++)
		tokens[t].listener_ino = 0;
}

/* Around every accept() of the application (net_addresses.c). */
void backlog_accept_begin(void)
{
	atomic_fetch_add(&accepting, 1);
}

void backlog_accept_end(void)
{
	atomic_fetch_sub(&accepting, 1);
}

/*
 * accept()/accept4() of the application, before the kernel's: a
 * connection taken from this listener's backlog if there is one (1, *fd
 * set; sa filled by the caller's getpeername), else 0.
 */
int backlog_accept(int listener, int flags, int *fd)
{
	uint64_t old;
	int i;

	if (!ntaken)
		return 0;
	lock(&old);
	forget_closed(listener, inode_of(listener));
	i = first_of(listener);
	if (i < 0) {
		unlock(&old);
		return 0;
	}
	if (tokens_of(listener) >= taken_of(listener))
		consume_token(listener);
	/* the lowest free number, as accept() gives */
	*fd = fcntl(taken[i].fd, (flags & SOCK_CLOEXEC) ? F_DUPFD_CLOEXEC : F_DUPFD, 0);
	if (*fd >= 0) {
		close(taken[i].fd);
		if (flags & SOCK_NONBLOCK)
			fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) | O_NONBLOCK);
		forget(i);
	}
	unlock(&old);
	return 1;
}

/* What the kernel's accept gave: 1 if it was one of our tokens left in
 * the backlog (closed: accept again), else 0. */
int backlog_was_token(int listener, int accepted)
{
	uint64_t old;
	int dropped;

	if (!ntokens)
		return 0;
	lock(&old);
	dropped = drop_if_token(listener, accepted);
	unlock(&old);
	return dropped;
}
