/*
 * TCP connections inside the job, flushed at FLUSH: each end sends a
 * marker (16 random bytes from the coordinator, new for each checkpoint)
 * and reads all its peer sent, up to the peer's marker.  Bytes a sender
 * still held, because its receiver's buffer was full, so reach the
 * receiver, and the image saves them as the receiver's queue.
 *
 * RESUME gives them back: each end returns what it read to its peer (a
 * block: the marker, a length, the bytes) and writes again what its peer
 * returned, which is what it had sent.  Each direction then carries
 *     application bytes | marker | returned block | the same bytes again
 * and every read takes exactly what belongs to its step, so the
 * application finds its bytes queued as before.  After a restart,
 * ckpt-restart refills the queues from the images instead.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "ckpt_sockopts.h"
#include "shim.h"

#define MAX_ENDS 256
#define MARKER_LEN 16
#define HEADER_LEN (MARKER_LEN + 8)	/* marker, little-endian length */
#define FLUSH_TIMEOUT_MS 20000
#define READ_CHUNK (256 << 10)
#define BLOCK_MAX (1ULL << 34)		/* more than any socket buffers hold */
#define PEER_CLOSED ESHUTDOWN		/* read() gave 0 */

struct byte_buf {
	char *data;
	size_t len, cap;
};

enum end_step {
	CHOSEN,				/* DRAIN: ours to flush if the peer end is too */
	READING_TO_MARKER,		/* FLUSH: marker out, the peer's in */
	FLUSHED,
	EXCHANGING,			/* RESUME: each end returns what it read */
	WRITING_BACK,			/* and writes again what came back */
	GIVEN_BACK,
};

struct flushed_end {
	int fd;				/* the application's */
	int s;				/* our own copy, until RESUME */
	uint64_t ino;
	enum end_step step;
	int failed;
	size_t marker_sent;
	int marker_seen;
	struct byte_buf in;		/* what the peer sent before its marker */
	char header[HEADER_LEN];	/* of the block returning `in` */
	size_t block_sent;		/* of header and in */
	struct byte_buf back;		/* the peer's block: header, then our bytes */
	size_t back_want;		/* its whole length, once the header is in */
	size_t written_back;
};

static struct flushed_end ends[MAX_ENDS];
static int nends;
/* sockets we share with the process that flushes them: ours must not read
 * them (the application resumed) before it has given their bytes back */
static uint64_t others_ends[MAX_ENDS];
static int nothers_ends;
static unsigned char marker[MARKER_LEN];

static int buf_reserve(struct byte_buf *b, size_t more)
{
	size_t cap = b->cap ? b->cap : READ_CHUNK;
	char *data;

	if (b->len + more <= b->cap)
		return 0;
	if (more > BLOCK_MAX || b->len > BLOCK_MAX)
		return ENOMEM;
	while (cap < b->len + more)
		cap *= 2;
	data = scratch_map(cap);
	if (!data)
		return ENOMEM;
	if (b->len)
		memcpy(data, b->data, b->len);
	if (b->data)
		scratch_unmap(b->data, b->cap);
	b->data = data;
	b->cap = cap;
	return 0;
}

static int buf_append(struct byte_buf *b, const char *p, size_t len)
{
	int err = buf_reserve(b, len);

	if (!err) {
		memcpy(b->data + b->len, p, len);
		b->len += len;
	}
	return err;
}

static void buf_free(struct byte_buf *b)
{
	if (b->data)
		scratch_unmap(b->data, b->cap);
	*b = (struct byte_buf){ 0 };
}

static int parse_marker(const char *hex)
{
	for (int i = 0; i < MARKER_LEN; i++) {
		unsigned v;

		if (!hex || sscanf(hex + 2 * i, "%2x", &v) != 1)
			return EINVAL;
		marker[i] = v;
	}
	return 0;
}

static int tcp_established(int fd)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);
	int s = app_getfd(fd), proto = 0, ok;
	socklen_t plen = sizeof(proto);

	if (s < 0)
		return 0;
	ok = !getsockopt(s, SOL_SOCKET, SO_PROTOCOL, &proto, &plen) && proto == IPPROTO_TCP &&
	     !getsockopt(s, IPPROTO_TCP, TCP_INFO, &ti, &len) && ti.tcpi_state == TCP_ESTABLISHED;
	close(s);
	return ok;
}

static struct flushed_end *tcp_flushed_end(uint64_t ino)
{
	for (int i = 0; i < nends; i++)
		if (ends[i].ino == ino)
			return &ends[i];
	return NULL;
}

/* A socket shared by several processes is flushed by the first to claim
 * it: 0 (ours), EEXIST (another's) or an error. */
static int claim_end(uint64_t ino)
{
	char key[96], pid[16], owner[16];

	snprintf(key, sizeof(key), "sock:flush:%s:%llu", shim_hostname(), (unsigned long long)ino);
	snprintf(pid, sizeof(pid), "%d", getpid());
	return kv_claim(key, pid, owner, sizeof(owner));
}

static void done_key(uint64_t ino, char *key, size_t size)
{
	snprintf(key, size, "sock:given-back:%s:%llu", shim_hostname(), (unsigned long long)ino);
}

/* An urgent byte (MSG_OOB) not yet read is not carried: the flush reads
 * past its mark, and the bytes are written back as plain bytes. */
static void warn_urgent_byte(const struct flushed_end *e)
{
	char c;

	if (recv(e->s, &c, 1, MSG_OOB | MSG_PEEK | MSG_DONTWAIT) == 1)
		ckpt_warn("fd %d: the TCP urgent byte (MSG_OOB) queued there is lost, and its "
			  "mark with it: urgent data is not saved", e->fd);
}

/* 0, with the end chosen or left to its owner (a dup of one we have, or
 * another process's); else errno. */
static int choose_end(int fd)
{
	struct flushed_end *e = &ends[nends];
	struct stat st;
	int err;

	if (nends == MAX_ENDS)
		return EMFILE;
	memset(e, 0, sizeof(*e));
	e->fd = fd;
	e->s = app_getfd(fd);
	if (e->s < 0)
		return errno;
	err = fstat(e->s, &st) ? errno : 0;
	if (!err && !tcp_flushed_end(st.st_ino)) {
		e->ino = st.st_ino;
		err = claim_end(e->ino);
		if (!err)
			err = socket_end_ready(fd);
		if (!err) {
			warn_urgent_byte(e);
			nends++;
			return 0;
		}
		if (err == EEXIST && nothers_ends < MAX_ENDS)
			others_ends[nothers_ends++] = st.st_ino;
	}
	close(e->s);
	return err == EEXIST ? 0 : err;
}

/*
 * DRAIN: the ends FLUSH will empty: established TCP connections whose peer
 * is in the job (peers[i]: socket_peer() of socks[i]).  Each chosen end says so in the name service, and FLUSH
 * empties a connection only if its peer end was chosen too (one end may
 * be half closed while the other is not yet).  Sockets not chosen, and
 * not another process's, go to `others` (settled the old way); returns
 * how many, or -errno.
 */
int tcp_flush_choose(const int *socks, const int *peers, int n, int *others)
{
	int nothers = 0;

	nends = nothers_ends = 0;	/* the last RESUME let go of the last checkpoint's */
	for (int i = 0; i < n; i++) {
		int err;

		if (peers[i] != PEER_IN_JOB || !tcp_established(socks[i])) {
			others[nothers++] = socks[i];
			continue;
		}
		err = choose_end(socks[i]);
		if (err)
			return -err;
	}
	return nothers;
}

/* The returned block's header names its length. */
static int parse_header(struct flushed_end *e)
{
	uint64_t len;

	if (e->back_want || e->back.len < HEADER_LEN)
		return 0;
	if (memcmp(e->back.data, marker, MARKER_LEN))
		return EPROTO;
	memcpy(&len, e->back.data + MARKER_LEN, 8);
	if (len > BLOCK_MAX)
		return EPROTO;
	e->back_want = HEADER_LEN + len;
	return 0;
}

/* Bytes read past the peer's marker would start its returned block: kept
 * for it, should an aborted FLUSH end only at RESUME, when the peer may be
 * a step ahead. */
static int marker_found(struct flushed_end *e, char *at)
{
	char *after = at + MARKER_LEN;
	size_t n = e->in.data + e->in.len - after;

	e->marker_seen = 1;
	e->in.len = at - e->in.data;
	return n ? buf_append(&e->back, after, n) : 0;
}

static int read_to_marker(struct flushed_end *e)
{
	size_t from = e->in.len > MARKER_LEN ? e->in.len - MARKER_LEN : 0;
	ssize_t n;
	char *at;

	if (buf_reserve(&e->in, READ_CHUNK))
		return ENOMEM;
	n = recv(e->s, e->in.data + e->in.len, READ_CHUNK, MSG_DONTWAIT);
	if (n == 0)
		return PEER_CLOSED;
	if (n < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : errno;
	e->in.len += n;
	at = memmem(e->in.data + from, e->in.len - from, marker, MARKER_LEN);
	return at ? marker_found(e, at) : 0;
}

static int send_some(int s, const char *p, size_t len, size_t *done)
{
	ssize_t n = send(s, p + *done, len - *done, MSG_DONTWAIT | MSG_NOSIGNAL);

	if (n < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : errno;
	*done += n;
	return 0;
}

/* Exactly the returned block: what follows it is the peer's bytes again,
 * which stay queued for the application. */
static int read_block(struct flushed_end *e)
{
	size_t want = e->back_want ? e->back_want : HEADER_LEN;
	ssize_t n;

	if (buf_reserve(&e->back, want - e->back.len))
		return ENOMEM;
	n = recv(e->s, e->back.data + e->back.len, want - e->back.len, MSG_DONTWAIT);
	if (n == 0)
		return PEER_CLOSED;
	if (n < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : errno;
	e->back.len += n;
	return parse_header(e);
}

static int send_block(struct flushed_end *e)
{
	size_t done;
	int err;

	if (e->block_sent < HEADER_LEN)
		return send_some(e->s, e->header, HEADER_LEN, &e->block_sent);
	done = e->block_sent - HEADER_LEN;
	err = send_some(e->s, e->in.data, e->in.len, &done);
	e->block_sent = HEADER_LEN + done;
	return err;
}

static int block_sent(const struct flushed_end *e)
{
	return e->block_sent == HEADER_LEN + e->in.len;
}

static int block_received(const struct flushed_end *e)
{
	return e->back_want && e->back.len == e->back_want;
}

/* The step an end is at, once what it waited for is done. */
static int next_step(struct flushed_end *e, enum end_step until)
{
	uint64_t len = e->in.len;

	if (e->step == READING_TO_MARKER && e->marker_sent == MARKER_LEN && e->marker_seen)
		e->step = FLUSHED;
	if (e->step == FLUSHED && until > FLUSHED) {
		memcpy(e->header, marker, MARKER_LEN);
		memcpy(e->header + MARKER_LEN, &len, 8);
		e->step = EXCHANGING;
	}
	if (e->step == EXCHANGING && block_sent(e) && block_received(e))
		e->step = WRITING_BACK;
	if (e->step == WRITING_BACK && e->written_back == e->back.len - HEADER_LEN)
		e->step = GIVEN_BACK;
	return e->step == EXCHANGING ? parse_header(e) : 0;
}

static short wanted_events(const struct flushed_end *e)
{
	switch (e->step) {
	case READING_TO_MARKER:
		return (e->marker_sent < MARKER_LEN ? POLLOUT : 0) | (e->marker_seen ? 0 : POLLIN);
	case EXCHANGING:
		return (block_sent(e) ? 0 : POLLOUT) | (block_received(e) ? 0 : POLLIN);
	case WRITING_BACK:
		return POLLOUT;
	default:
		return 0;
	}
}

/* One step of one end, when poll says it can go on. */
static int advance(struct flushed_end *e, short revents)
{
	int in = revents & (POLLIN | POLLHUP | POLLERR), out = revents & (POLLOUT | POLLERR);
	int err = 0;

	switch (e->step) {
	case READING_TO_MARKER:
		if (out && e->marker_sent < MARKER_LEN)
			err = send_some(e->s, (const char *)marker, MARKER_LEN, &e->marker_sent);
		if (!err && in && !e->marker_seen)
			err = read_to_marker(e);
		break;
	case EXCHANGING:
		if (out && !block_sent(e))
			err = send_block(e);
		if (!err && in && !block_received(e))
			err = read_block(e);
		break;
	case WRITING_BACK:
		err = send_some(e->s, e->back.data + HEADER_LEN, e->back.len - HEADER_LEN,
				&e->written_back);
		break;
	default:
		break;
	}
	return err;
}

/*
 * Nobody reads while the bytes go back, so they must fit in the peer's
 * receive queue and our send queue, as they did before the checkpoint;
 * but the receive window may have closed further since.  A send buffer
 * that stays full grows by what is left to write, if it can.
 */
static void grow_send_buffer(struct flushed_end *e)
{
	ckpt_grow_send_buffer(e->s, e->back.len - HEADER_LEN - e->written_back);
}

static void end_failed(struct flushed_end *e, int err, char *why, size_t why_size)
{
	snprintf(why, why_size, "fd %d: TCP connection inside the job: %s", e->fd,
		 err == PEER_CLOSED ? "the peer closed its side" : shim_strerror(err));
	e->failed = 1;
}

/* The ends still on their way to `until`, as a poll set. */
static int poll_set(enum end_step until, struct pollfd *pfd, struct flushed_end **of,
		    char *why, size_t why_size, int *err)
{
	int n = 0;

	for (int i = 0; i < nends; i++) {
		struct flushed_end *e = &ends[i];
		int e_err;

		if (e->failed || e->step == CHOSEN || e->step >= until)
			continue;
		e_err = next_step(e, until);
		if (e_err) {
			end_failed(e, e_err, why, why_size);
			*err = e_err;
		} else if (e->step < until) {
			pfd[n] = (struct pollfd){ .fd = e->s, .events = wanted_events(e) };
			of[n++] = e;
		}
	}
	return n;
}

/*
 * Moves every started end on until each is at `until`: one poll over them
 * all, since each end's peer does the same at the same time.  An end that
 * fails is reported in why; the others go on.
 */
static int run_ends(enum end_step until, const char *doing, char *why, size_t why_size)
{
	struct pollfd pfd[MAX_ENDS];
	struct flushed_end *of[MAX_ENDS];
	int64_t deadline = shim_now_ns() + FLUSH_TIMEOUT_MS * 1000000LL;
	int err = 0, n;

	while ((n = poll_set(until, pfd, of, why, why_size, &err)) > 0) {
		int ready;

		if (shim_now_ns() > deadline) {
			snprintf(why, why_size, "fd %d%s: TCP connection inside the job not %s after "
				 "%d s", of[0]->fd, n > 1 ? " and others" : "", doing,
				 FLUSH_TIMEOUT_MS / 1000);
			return ETIMEDOUT;
		}
		ready = syscall(SYS_poll, pfd, n, 100);	/* not the shim's poll(): no dlsym here */
		if (ready < 0 && errno != EINTR) {
			err = errno;
			snprintf(why, why_size, "poll: %s", shim_strerror(err));
			return err;
		}
		for (int j = 0; j < n; j++) {
			int e_err = 0;

			if (ready == 0 && of[j]->step == WRITING_BACK)
				grow_send_buffer(of[j]);
			else if (pfd[j].revents)
				e_err = advance(of[j], pfd[j].revents);
			if (e_err) {
				end_failed(of[j], e_err, why, why_size);
				err = e_err;
			}
		}
	}
	return err;
}

/* FLUSH: the chosen ends whose peer end was chosen too, all at once; the
 * others settle as at DRAIN. */
int tcp_flush(const char *marker_hex, char *why, size_t why_size)
{
	int settle[MAX_ENDS], nsettle = 0, err = parse_marker(marker_hex);

	if (err) {
		snprintf(why, why_size, "FLUSH without a marker");
		return err;
	}
	for (int i = 0; i < nends; i++) {
		if (socket_peer_ready(ends[i].fd))
			ends[i].step = READING_TO_MARKER;
		else
			settle[nsettle++] = ends[i].fd;
	}
	err = sockets_settle(settle, nsettle, why, why_size);
	return err ? err : run_ends(FLUSHED, "flushed", why, why_size);
}

/* What FLUSH read on the socket with inode ino: its queue in the image. */
int tcp_flushed_queue(uint64_t ino, const char **data, size_t *len)
{
	const struct flushed_end *e = tcp_flushed_end(ino);

	if (!e || e->failed || e->step < FLUSHED)
		return 0;
	*data = e->in.data;
	*len = e->in.len;
	return 1;
}

/* Until the processes that flush the sockets we share with them have
 * given the bytes back: our application must not take them first. */
static void wait_for_owners(void)
{
	for (int i = 0; i < nothers_ends; i++) {
		char key[96];
		int err;

		done_key(others_ends[i], key, sizeof(key));
		err = kv_wait(key, FLUSH_TIMEOUT_MS / 1000 + 5);
		if (err)
			ckpt_warn("a TCP connection shared with another process of the job was not "
				  "given back by it: %s", shim_strerror(err));
	}
	nothers_ends = 0;
}

/*
 * RESUME: the bytes go back where they were.  A connection that cannot
 * have them back is shut down, so that both programs see an error rather
 * than a stream with a hole.  After a restart the bytes are there already
 * (ckpt-restart), and our fds and buffers belonged to the old process.
 */
void tcp_flush_give_back(int restarted)
{
	char why[200] = "";

	if (restarted) {
		nends = nothers_ends = 0;
		return;
	}
	if (nends && run_ends(GIVEN_BACK, "put back", why, sizeof(why)))
		ckpt_warn("%s", why);
	for (int i = 0; i < nends; i++) {
		struct flushed_end *e = &ends[i];
		char key[96];

		if (e->step != CHOSEN && e->step != GIVEN_BACK) {
			ckpt_warn("fd %d: a TCP connection inside the job could not be put back as it "
				  "was (%zu bytes had been flushed from it): it is shut down",
				  e->fd, e->in.len);
			shutdown(e->s, SHUT_RDWR);
		}
		done_key(e->ino, key, sizeof(key));
		ckpt_kv_put(key, "1");
		close(e->s);
		buf_free(&e->in);
		buf_free(&e->back);
	}
	nends = 0;
	wait_for_owners();
}
