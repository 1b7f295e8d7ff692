/*
 * softverbs: the wire.
 *
 * Every QP owns a non-blocking AF_UNIX datagram socket bound in the
 * abstract namespace to "softverbs.<fabric>.<lid>.<qpn>", so the address
 * of a remote QP follows from the (LID, QPN) pair an application already
 * exchanges, and the kernel guarantees QPN uniqueness per LID at bind().
 * AF_UNIX datagrams are reliable and ordered per sender; a full receiver
 * queue makes sendmsg() fail with EAGAIN, which we treat like link-level
 * credit back-pressure: the WQE stays queued and is retried.
 *
 * QPs of other hosts are reached over UDP (see sv_resolve()).
 *
 * UD: one datagram per message; no posted receive or bad Q_Key = dropped.
 * RC: requests carry a 24-bit PSN (one per message) and are segmented into
 * SV_PKT_PAYLOAD pieces.  The responder answers every message with a
 * cumulative ACK (delayed briefly so that a reply request can carry it),
 * a READ response, or a NAK (RNR, remote access, invalid request, remote
 * operational error).  The requester completes on ACK, goes back to the
 * NAKed PSN after an RNR delay, and retransmits after the QP's timeout if
 * a request went unanswered (the responder drops requests when it is not
 * in RTR/RTS), giving RETRY_EXC_ERR once retry_cnt is spent.
 * UC: like RC without acknowledgements.
 *
 * Progress happens in poll_cq / post_send of the application and in one
 * thread per context, which waits in epoll on all QP sockets but stays out
 * of the way (polls a wake fd only) while the application itself is
 * polling, so busy-polling latency is not disturbed.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include "sv.h"

enum sv_op {
	SV_OP_UD = 1,
	SV_OP_SEND,
	SV_OP_WRITE,
	SV_OP_READ_REQ,
	SV_OP_READ_RESP,
	SV_OP_ACK,
	SV_OP_NAK,
};

enum {
	SV_F_FIRST = 1 << 0,
	SV_F_LAST = 1 << 1,
	SV_F_IMM = 1 << 2,
	SV_F_GRH = 1 << 3,
	SV_F_SOLICITED = 1 << 4,
	SV_F_PIGGY = 1 << 5,		/* ack_psn acknowledges our requests */
};

enum sv_nak {
	SV_NAK_RNR = 1,
	SV_NAK_REM_ACCESS,
	SV_NAK_INV_REQ,
	SV_NAK_REM_OP,
};

struct sv_pkt {
	uint8_t op;
	uint8_t flags;
	uint8_t sl;
	uint8_t syndrome;		/* NAK reason */
	uint16_t src_lid;
	uint16_t aux;			/* RNR NAK: responder's min_rnr_timer */
	uint32_t src_qpn;
	uint32_t dst_qpn;
	uint32_t psn;
	uint32_t qkey;
	uint32_t imm;			/* network order */
	uint32_t msg_len;		/* whole message */
	uint32_t offset;		/* of this packet's payload */
	uint32_t rkey;
	uint32_t ack_psn;		/* with SV_F_PIGGY */
	uint32_t pad;
	uint64_t raddr;			/* message base address */
	uint8_t grh[SV_GRH_LEN];	/* UD with SV_F_GRH */
};

/* ---- addressing ---- */

#define SV_ROUTES 256

struct sv_route {
	uint16_t lid;
	uint32_t qpn;
	bool valid;
	struct sv_addr addr;
};

static void unix_name(uint16_t lid, uint32_t qpn, struct sv_addr *a)
{
	int n;

	memset(a, 0, sizeof(*a));
	a->un.sun_family = AF_UNIX;
	n = snprintf(a->un.sun_path + 1, sizeof(a->un.sun_path) - 1,
		     "softverbs.%012llx.%04x.%06x",
		     (unsigned long long)sv_cfg.fabric, lid, qpn);
	a->len = offsetof(struct sockaddr_un, sun_path) + 1 + n;
	a->udp = false;
}

static void route_path(uint16_t lid, uint32_t qpn, char *buf, size_t len)
{
	snprintf(buf, len, "%.200s/qp/%04x.%06x", sv_cfg.dir, lid, qpn);
}

/* Publish "<ipv4> <udp port>" for the QP so other hosts sharing the
 * runtime dir can reach it. */
static int route_publish(uint16_t lid, uint32_t qpn, uint16_t port)
{
	char path[300], tmp[320];
	FILE *f;

	route_path(lid, qpn, path, sizeof(path));
	snprintf(tmp, sizeof(tmp), "%s.%d", path, (int)getpid());
	f = fopen(tmp, "w");
	if (!f)
		return -1;
	fprintf(f, "%s %u\n", sv_cfg.host, port);
	fclose(f);
	return rename(tmp, path);
}

/* (LID, QPN) -> address.  QPs of this host are reached through their
 * AF_UNIX name, others through UDP at the address they published.  An
 * unknown QP gets its would-be local name: sends to it are lost, as
 * packets to a non-existent QP are on a real fabric. */
void sv_resolve(struct sv_context *ctx, uint16_t lid, uint32_t qpn,
		struct sv_addr *a)
{
	uint32_t h = (uint32_t)sv_mix64(((uint64_t)lid << 24) | qpn) %
		     SV_ROUTES;
	struct sv_route *r;
	char path[300], ip[32];
	unsigned port;
	FILE *f;

	if (!ctx->routes)
		ctx->routes = calloc(SV_ROUTES, sizeof(*ctx->routes));
	r = ctx->routes ? &ctx->routes[h] : NULL;
	if (r && r->valid && r->lid == lid && r->qpn == qpn) {
		*a = r->addr;
		return;
	}
	unix_name(lid, qpn, a);
	route_path(lid, qpn, path, sizeof(path));
	f = fopen(path, "r");
	if (!f)
		return;		/* not (yet) known: not cached */
	if (fscanf(f, "%31s %u", ip, &port) == 2 && strcmp(ip, sv_cfg.host)) {
		memset(a, 0, sizeof(*a));
		a->in.sin_family = AF_INET;
		a->in.sin_port = htons((uint16_t)port);
		inet_pton(AF_INET, ip, &a->in.sin_addr);
		a->len = sizeof(a->in);
		a->udp = true;
	}
	fclose(f);
	if (r) {
		r->lid = lid;
		r->qpn = qpn;
		r->addr = *a;
		r->valid = true;
	}
}

static int udp_open(struct sv_context *ctx, struct sv_qp *qp)
{
	/* low pointer bit tags the UDP socket of the QP */
	struct epoll_event ev = { .events = EPOLLIN,
				  .data.ptr = (void *)((uintptr_t)qp | 1) };
	struct sockaddr_in sin = { .sin_family = AF_INET,
				   .sin_addr.s_addr = sv_cfg.ipv4 };
	socklen_t len = sizeof(sin);
	int sz = 4 << 20;

	qp->ufd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (qp->ufd < 0)
		return -1;
	if (setsockopt(qp->ufd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof(sz)))
		setsockopt(qp->ufd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	if (setsockopt(qp->ufd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof(sz)))
		setsockopt(qp->ufd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	/* the device's address; any address if it is not configured here */
	if (bind(qp->ufd, (struct sockaddr *)&sin, sizeof(sin))) {
		sin.sin_addr.s_addr = htonl(INADDR_ANY);
		if (bind(qp->ufd, (struct sockaddr *)&sin, sizeof(sin)))
			return -1;
	}
	if (getsockname(qp->ufd, (struct sockaddr *)&sin, &len) ||
	    epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, qp->ufd, &ev))
		return -1;
	return route_publish(ctx->inc.lid, qp->ibqp.qp_num,
			     ntohs(sin.sin_port));
}

int sv_qp_bind(struct sv_context *ctx, struct sv_qp *qp)
{
	struct epoll_event ev = { .events = EPOLLIN };
	int sz = 4 << 20;

	qp->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (qp->fd < 0)
		return errno;
	/* Room for many in-flight 64 KiB segments: AF_UNIX charges queued
	 * datagrams to the sender's buffer. */
	if (setsockopt(qp->fd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof(sz)))
		setsockopt(qp->fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	for (int tries = 0; tries < 1000; tries++) {
		struct sv_addr a;
		uint32_t qpn = sv_draw_qpn(ctx->dev, &ctx->inc);

		if (!qpn)
			break;
		unix_name(ctx->inc.lid, qpn, &a);
		if (!bind(qp->fd, &a.sa, a.len)) {
			qp->ibqp.qp_num = qpn;
			ev.data.ptr = qp;
			if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, qp->fd, &ev) ||
			    udp_open(ctx, qp))
				break;
			return 0;
		}
		if (errno != EADDRINUSE)
			break;
	}
	sv_qp_unbind(ctx, qp);
	return EAGAIN;
}

void sv_qp_unbind(struct sv_context *ctx, struct sv_qp *qp)
{
	char path[300];

	if (qp->ufd >= 0) {
		epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, qp->ufd, NULL);
		close(qp->ufd);
		route_path(ctx->inc.lid, qp->ibqp.qp_num, path, sizeof(path));
		unlink(path);
	}
	if (qp->fd >= 0) {
		epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, qp->fd, NULL);
		close(qp->fd);
	}
	qp->fd = qp->ufd = -1;
}

/* ---- helpers ---- */

static inline int32_t psn_diff(uint32_t a, uint32_t b)
{
	/* signed distance in the 24-bit PSN space */
	return (int32_t)((a - b) << 8) >> 8;
}

static inline struct sv_swqe *sq_slot(struct sv_qp *qp, uint32_t i)
{
	return &qp->sq[i % qp->sq_cap];
}

static uint64_t timeout_ns(uint8_t t)
{
	uint64_t ns;

	if (!t)
		return 0;	/* infinite */
	ns = 4096ull << (t > 31 ? 31 : t);
	/* floor: the responder is a process that can be descheduled far
	 * longer than a wire round trip */
	return ns < 100000000ull ? 100000000ull : ns;
}

/* IB encoded RNR NAK timer (table 45 of the spec), in nanoseconds */
static uint64_t rnr_timer_ns(uint8_t v)
{
	static const uint32_t us[32] = {
		655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640,
		960, 1280, 1920, 2560, 3840, 5120, 7680, 10240, 15360, 20480,
		30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680,
		491520,
	};
	return (uint64_t)us[v & 31] * 1000;
}

static uint32_t seg_size(const struct sv_qp *qp)
{
	/* a UDP datagram cannot carry 64 KiB plus our header */
	return qp->peer.udp ? SV_UDP_PAYLOAD : SV_PKT_PAYLOAD;
}

static bool qp_can_receive(const struct sv_qp *qp)
{
	return qp->ibqp.state == IBV_QPS_RTR || qp->ibqp.state == IBV_QPS_RTS ||
	       qp->ibqp.state == IBV_QPS_SQD || qp->ibqp.state == IBV_QPS_SQE;
}

static ssize_t send_pkt(struct sv_qp *qp, const struct sv_addr *to,
			struct iovec *iov, int iovcnt)
{
	struct msghdr mh = {
		.msg_name = (void *)&to->sa,
		.msg_namelen = to->len,
		.msg_iov = iov,
		.msg_iovlen = iovcnt,
	};
	ssize_t n;

	do {
		n = sendmsg(to->udp ? qp->ufd : qp->fd, &mh,
			    MSG_DONTWAIT | MSG_NOSIGNAL);
	} while (n < 0 && errno == EINTR);
	return n;
}

/* A destination that does not exist behaves like a packet lost on the
 * fabric: the sender can only notice by missing acknowledgements. */
static bool lost_on_fabric(int err)
{
	return err == ECONNREFUSED || err == ENOENT || err == ENOTCONN;
}

static void fill_pkt(struct sv_context *ctx, struct sv_qp *qp,
		     struct sv_pkt *p, uint8_t op)
{
	memset(p, 0, offsetof(struct sv_pkt, grh));
	p->op = op;
	p->src_lid = ctx->inc.lid;
	p->src_qpn = qp->ibqp.qp_num;
	p->dst_qpn = qp->attr.dest_qp_num;
	p->sl = qp->attr.ah_attr.sl;
}

static int ctl_send(struct sv_context *ctx, struct sv_qp *qp, uint8_t op,
		    uint32_t psn, uint8_t syndrome)
{
	struct sv_pkt p;
	struct iovec iov = { &p, offsetof(struct sv_pkt, grh) };

	fill_pkt(ctx, qp, &p, op);
	p.psn = psn;
	p.syndrome = syndrome;
	p.aux = qp->attr.min_rnr_timer;
	if (send_pkt(qp, &qp->peer, &iov, 1) < 0 &&
	    errno == EAGAIN)
		return EAGAIN;
	return 0;
}

/* Send a pending ACK now.  Hardware acknowledges on receipt, so ACKs we
 * delayed must not die with the QP (destroy, reset, error). */
void sv_qp_ack_flush(struct sv_context *ctx, struct sv_qp *qp)
{
	if (qp->ack_pending && qp->peer.len)
		ctl_send(ctx, qp, SV_OP_ACK, qp->ack_psn, 0);
	qp->ack_pending = false;
	qp->ack_count = 0;
}

static void ack_flush(struct sv_context *ctx, struct sv_qp *qp)
{
	if (ctl_send(ctx, qp, SV_OP_ACK, qp->ack_psn, 0) == EAGAIN)
		return;		/* retried by the next progress pass */
	qp->ack_pending = false;
	qp->ack_count = 0;
}

/*
 * Acknowledge up to psn.  While the application is polling, the ACK waits
 * a little: a reply posted meanwhile carries it (SV_F_PIGGY), which saves
 * a packet per message in ping-pong traffic, and streams get coalesced
 * ACKs.  The progress thread (application not polling) and duplicates
 * acknowledge at once.
 */
static void send_ack(struct sv_context *ctx, struct sv_qp *qp, uint32_t psn,
		     bool now)
{
	if (qp->ibqp.qp_type != IBV_QPT_RC)
		return;
	if (!qp->ack_pending)
		qp->ack_due_ns = sv_now_ns() + SV_ACK_DELAY_NS;
	qp->ack_psn = psn;
	qp->ack_pending = true;
	if (now || ctx->in_thread || ++qp->ack_count >= SV_ACK_COALESCE)
		ack_flush(ctx, qp);
}

static void send_nak(struct sv_context *ctx, struct sv_qp *qp, uint32_t psn,
		     uint8_t syndrome)
{
	if (qp->ibqp.qp_type != IBV_QPT_RC)
		return;
	/* a lost NAK is recovered by the requester's timeout */
	ctl_send(ctx, qp, SV_OP_NAK, psn, syndrome);
}

/* ---- scatter / gather with key checks ---- */

static uint32_t sge_total(const struct ibv_sge *sge, int n)
{
	uint64_t t = 0;

	for (int i = 0; i < n; i++)
		t += sge[i].length;
	return t > UINT32_MAX ? UINT32_MAX : (uint32_t)t;
}

static bool sge_ok(struct sv_context *ctx, struct ibv_pd *pd,
		   const struct ibv_sge *s, bool write)
{
	struct sv_mr *mr;
	uintptr_t a = (uintptr_t)s->addr, base;

	if (!s->length)
		return true;
	mr = sv_mr_lookup(ctx, s->lkey);
	if (!mr || mr->ibmr.pd != pd)
		return false;
	if (write && !(mr->access & IBV_ACCESS_LOCAL_WRITE))
		return false;
	base = (uintptr_t)mr->ibmr.addr;
	return a >= base && a + s->length <= base + mr->ibmr.length &&
	       a + s->length >= a;
}

static bool sges_ok(struct sv_context *ctx, struct ibv_pd *pd,
		    const struct ibv_sge *sge, int n, bool write)
{
	for (int i = 0; i < n; i++)
		if (!sge_ok(ctx, pd, &sge[i], write))
			return false;
	return true;
}

/*
 * The adapter's DMA into registered memory.  A real HCA writes to the pages
 * the registration pinned, even if the application has unmapped them since:
 * the data just lands nowhere visible.  UCX does that at teardown (a UD
 * interface frees its receive buffers, then destroys its QP; the
 * registration cache deregisters lazily).  The progress thread, which runs
 * at any moment, copies through the kernel (process_vm_writev on ourselves)
 * so an unmapped page fails the copy instead of faulting; the application's
 * own poll, which cannot overlap its frees in that way, copies directly
 * (a system call per message would double the latency).
 */
static __thread bool dma_checked;

static void dma_write(void *dst, const void *src, size_t len)
{
	static bool no_vm_writev;
	struct iovec local = { (void *)src, len }, remote = { dst, len };

	if (dma_checked && !no_vm_writev) {
		if (process_vm_writev(getpid(), &local, 1, &remote, 1, 0) >= 0 ||
		    errno == EFAULT)
			return;
		no_vm_writev = true;	/* not allowed here (seccomp) */
	}
	memcpy(dst, src, len);
}

/* Copy len bytes at message offset off into a scatter list. */
static void scatter(const struct ibv_sge *sge, int n, uint32_t off,
		    const uint8_t *data, uint32_t len)
{
	for (int i = 0; i < n && len; i++) {
		uint32_t l = sge[i].length;

		if (off >= l) {
			off -= l;
			continue;
		}
		uint32_t c = l - off < len ? l - off : len;

		dma_write((uint8_t *)(uintptr_t)sge[i].addr + off, data, c);
		data += c;
		len -= c;
		off = 0;
	}
}

/* Build iovecs for bytes [off, off+len) of a gather list. */
static int gather_iov(const struct ibv_sge *sge, int n, uint32_t off,
		      uint32_t len, struct iovec *iov)
{
	int k = 0;

	for (int i = 0; i < n && len; i++) {
		uint32_t l = sge[i].length;

		if (off >= l) {
			off -= l;
			continue;
		}
		uint32_t c = l - off < len ? l - off : len;

		iov[k].iov_base = (uint8_t *)(uintptr_t)sge[i].addr + off;
		iov[k++].iov_len = c;
		len -= c;
		off = 0;
	}
	return k;
}

/* Resolve a remote key for an incoming RDMA request. */
static struct sv_mr *rkey_check(struct sv_context *ctx, struct sv_qp *qp,
				uint32_t rkey, uint64_t raddr, uint32_t len,
				int need)
{
	struct sv_mr *mr = sv_mr_lookup(ctx, rkey);

	if (!mr || mr->ibmr.pd != qp->ibqp.pd || !(mr->access & need) ||
	    !(qp->attr.qp_access_flags & need))
		return NULL;
	if (raddr < mr->iova || raddr + len < raddr ||
	    raddr + len > mr->iova + mr->ibmr.length)
		return NULL;
	return mr;
}

static inline uint8_t *mr_ptr(struct sv_mr *mr, uint64_t raddr)
{
	return (uint8_t *)mr->ibmr.addr + (raddr - mr->iova);
}

/* ---- completions ---- */

static enum ibv_wc_opcode wc_opcode(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return IBV_WC_RDMA_WRITE;
	case IBV_WR_RDMA_READ:
		return IBV_WC_RDMA_READ;
	default:
		return IBV_WC_SEND;
	}
}

static void complete_send(struct sv_context *ctx, struct sv_qp *qp,
			  struct sv_swqe *w, enum ibv_wc_status status)
{
	struct ibv_wc wc = {
		.wr_id = w->wr_id,
		.status = status,
		.opcode = wc_opcode(w->opcode),
		.qp_num = qp->ibqp.qp_num,
		.byte_len = w->opcode == IBV_WR_RDMA_READ ? w->len : 0,
	};

	if (status == IBV_WC_SUCCESS && !qp->sq_sig_all &&
	    !(w->send_flags & IBV_SEND_SIGNALED))
		return;
	sv_cq_push(ctx, to_scq(qp->ibqp.send_cq), &wc, false);
}

static void complete_recv(struct sv_context *ctx, struct sv_qp *qp,
			  const struct sv_rwqe *r, enum ibv_wc_status status,
			  const struct sv_pkt *p, enum ibv_wc_opcode op,
			  uint32_t byte_len, unsigned int flags)
{
	struct ibv_wc wc = {
		.wr_id = r->wr_id,
		.status = status,
		.opcode = op,
		.qp_num = qp->ibqp.qp_num,
	};

	if (status == IBV_WC_SUCCESS && p) {
		wc.byte_len = byte_len;
		wc.src_qp = p->src_qpn;
		wc.slid = p->src_lid;
		wc.sl = p->sl;
		wc.wc_flags = flags;
		if (p->flags & SV_F_IMM) {
			wc.wc_flags |= IBV_WC_WITH_IMM;
			wc.imm_data = p->imm;
		}
	}
	sv_cq_push(ctx, to_scq(qp->ibqp.recv_cq), &wc,
		   p && (p->flags & SV_F_SOLICITED));
}

/* Take the next receive WQE from the QP's RQ or its SRQ. */
static bool rq_take(struct sv_context *ctx, struct sv_qp *qp,
		    struct sv_rwqe *out)
{
	struct sv_srq *srq = qp->ibqp.srq ? to_ssrq(qp->ibqp.srq) : NULL;
	struct sv_rq *rq = srq ? &srq->rq : &qp->rq;

	if (!rq->count)
		return false;
	*out = rq->wqe[rq->head];
	rq->head = (rq->head + 1) % rq->cap;
	rq->count--;
	if (srq && srq->limit && rq->count < srq->limit) {
		srq->limit = 0;		/* the limit is one-shot */
		sv_async_push(ctx, IBV_EVENT_SRQ_LIMIT_REACHED, srq);
	}
	return true;
}

static bool rq_empty(struct sv_qp *qp)
{
	if (qp->ibqp.srq)
		return !to_ssrq(qp->ibqp.srq)->rq.count;
	return !qp->rq.count;
}

void sv_qp_flush(struct sv_context *ctx, struct sv_qp *qp)
{
	while (qp->sq_head != qp->sq_tail) {
		complete_send(ctx, qp, sq_slot(qp, qp->sq_head),
			      IBV_WC_WR_FLUSH_ERR);
		qp->sq_head++;
	}
	qp->sq_tx = qp->sq_head;
	qp->ack_deadline_ns = qp->retx_at_ns = 0;
	if (qp->rx_active && qp->rx_have_wqe)
		complete_recv(ctx, qp, &qp->rx_wqe, IBV_WC_WR_FLUSH_ERR, NULL,
			      IBV_WC_RECV, 0, 0);
	qp->rx_active = qp->rx_have_wqe = false;
	if (qp->ibqp.srq)
		return;		/* SRQ WQEs are shared: nothing to flush */
	while (qp->rq.count) {
		struct sv_rwqe r;

		rq_take(ctx, qp, &r);
		complete_recv(ctx, qp, &r, IBV_WC_WR_FLUSH_ERR, NULL,
			      IBV_WC_RECV, 0, 0);
	}
}

/* Complete the requester's send queue up to and including psn. */
static void sq_ack_upto(struct sv_context *ctx, struct sv_qp *qp, uint32_t psn)
{
	bool progress = false;

	while (qp->sq_head != qp->sq_tx) {
		struct sv_swqe *w = sq_slot(qp, qp->sq_head);

		if (psn_diff(w->psn, psn) > 0)
			break;
		/* a READ is done when its data is, whatever the ACKs say
		 * (UDP may reorder a response behind a later ACK) */
		if (w->opcode == IBV_WR_RDMA_READ && w->rx_off < w->len)
			break;
		complete_send(ctx, qp, w, IBV_WC_SUCCESS);
		qp->sq_head++;
		progress = true;
	}
	if (progress) {
		qp->retry_left = qp->attr.retry_cnt;
		qp->rnr_left = qp->attr.rnr_retry;
		uint64_t t = timeout_ns(qp->attr.timeout);

		qp->ack_deadline_ns = t && qp->sq_head != qp->sq_tx ?
				      sv_now_ns() + t : 0;
	}
}

/* Complete the WQE at the head with an error and move the QP to ERR. */
static void sq_fail_head(struct sv_context *ctx, struct sv_qp *qp,
			 enum ibv_wc_status status)
{
	if (qp->sq_head != qp->sq_tail) {
		complete_send(ctx, qp, sq_slot(qp, qp->sq_head), status);
		qp->sq_head++;
		if (psn_diff(qp->sq_tx, qp->sq_head) < 0)
			qp->sq_tx = qp->sq_head;
	}
	sv_qp_to_error(ctx, qp);
}

/* Go back to the oldest unacknowledged request and send it all again. */
static void sq_rewind(struct sv_qp *qp)
{
	for (uint32_t i = qp->sq_head; i != qp->sq_tx; i++) {
		sq_slot(qp, i)->tx_off = 0;
		sq_slot(qp, i)->rx_off = 0;
	}
	qp->sq_tx = qp->sq_head;
	qp->ack_deadline_ns = 0;
}

/* ---- UD ---- */

static void fill_grh(struct sv_context *ctx, struct sv_pkt *p,
		     const struct ibv_ah_attr *av, uint32_t len)
{
	struct ibv_grh g;

	memset(&g, 0, sizeof(g));
	g.version_tclass_flow = htobe32((6u << 28) |
					((uint32_t)av->grh.traffic_class << 20) |
					(av->grh.flow_label & 0xfffff));
	g.paylen = htobe16((uint16_t)(len + 8 + 4 + 4));  /* BTH+DETH+ICRC */
	g.next_hdr = 0x1b;
	g.hop_limit = av->grh.hop_limit;
	g.sgid.global.subnet_prefix = htobe64(SV_SUBNET_PREFIX);
	g.sgid.global.interface_id = htobe64(ctx->dev->node_guid);
	g.dgid = av->grh.dgid;
	memcpy(p->grh, &g, sizeof(g));
}

/* Returns 0 when the WQE is done (sent or dropped), EAGAIN to retry. */
static int ud_tx(struct sv_context *ctx, struct sv_qp *qp, struct sv_swqe *w)
{
	struct iovec iov[SV_MAX_SGE + 1];
	struct sv_addr to;
	struct sv_pkt p;
	int n = 1;

	if (w->len > SV_UD_MTU) {
		complete_send(ctx, qp, w, IBV_WC_LOC_LEN_ERR);
		return 0;
	}
	fill_pkt(ctx, qp, &p, SV_OP_UD);
	p.flags = SV_F_FIRST | SV_F_LAST;
	if (w->opcode == IBV_WR_SEND_WITH_IMM)
		p.flags |= SV_F_IMM;
	if (w->send_flags & IBV_SEND_SOLICITED)
		p.flags |= SV_F_SOLICITED;
	p.dst_qpn = w->rqpn;
	p.qkey = w->rqkey;
	p.imm = w->imm;
	p.sl = w->av.sl;
	p.msg_len = w->len;
	iov[0].iov_base = &p;
	iov[0].iov_len = offsetof(struct sv_pkt, grh);
	if (w->av.is_global) {
		p.flags |= SV_F_GRH;
		fill_grh(ctx, &p, &w->av, w->len);
		iov[0].iov_len = sizeof(p);
	}
	if (w->send_flags & IBV_SEND_INLINE) {
		iov[1].iov_base = w->inl;
		iov[1].iov_len = w->len;
		n = 2;
	} else {
		n += gather_iov(w->sge, w->num_sge, 0, w->len, iov + 1);
	}
	sv_resolve(ctx, w->av.dlid, w->rqpn, &to);
	if (send_pkt(qp, &to, iov, n) < 0 && errno == EAGAIN) {
		uint64_t now = sv_now_ns();
		bool known_stalled = qp->stalled_lid == w->av.dlid &&
				     qp->stalled_qpn == w->rqpn &&
				     now < qp->stalled_until_ns;

		if (!w->first_tx_ns)
			w->first_tx_ns = now;
		/* A receiver that does not drain for this long is gone or
		 * stopped: UD may drop, the sender must not hang.  Until
		 * then this is fabric back-pressure. */
		if (!known_stalled && now - w->first_tx_ns < SV_UD_STALL_NS)
			return EAGAIN;
		qp->stalled_lid = w->av.dlid;
		qp->stalled_qpn = w->rqpn;
		qp->stalled_until_ns = now + SV_UD_STALL_NS;
	} else if (qp->stalled_lid == w->av.dlid && qp->stalled_qpn == w->rqpn) {
		qp->stalled_until_ns = 0;	/* it drains again */
	}
	complete_send(ctx, qp, w, IBV_WC_SUCCESS);
	return 0;
}

static void ud_rx(struct sv_context *ctx, struct sv_qp *qp,
		  const struct sv_pkt *p, const uint8_t *data, uint32_t len)
{
	struct sv_rwqe r;
	uint32_t cap;

	if (qp->ibqp.qp_type != IBV_QPT_UD || !qp_can_receive(qp) ||
	    p->qkey != qp->attr.qkey || len != p->msg_len)
		return;		/* silently dropped, as on the wire */
	if (!rq_take(ctx, qp, &r))
		return;
	cap = sge_total(r.sge, r.num_sge);
	if (len + SV_GRH_LEN > cap) {
		complete_recv(ctx, qp, &r, IBV_WC_LOC_LEN_ERR, p, IBV_WC_RECV,
			      0, 0);
		return;
	}
	if (!sges_ok(ctx, qp->ibqp.pd, r.sge, r.num_sge, true)) {
		complete_recv(ctx, qp, &r, IBV_WC_LOC_PROT_ERR, p, IBV_WC_RECV,
			      0, 0);
		return;
	}
	if (p->flags & SV_F_GRH)
		scatter(r.sge, r.num_sge, 0, p->grh, SV_GRH_LEN);
	scatter(r.sge, r.num_sge, SV_GRH_LEN, data, len);
	complete_recv(ctx, qp, &r, IBV_WC_SUCCESS, p, IBV_WC_RECV,
		      len + SV_GRH_LEN, (p->flags & SV_F_GRH) ? IBV_WC_GRH : 0);
}

/* ---- RC / UC requester ---- */

static uint8_t req_op(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return SV_OP_WRITE;
	case IBV_WR_RDMA_READ:
		return SV_OP_READ_REQ;
	default:
		return SV_OP_SEND;
	}
}

/* Transmit (the rest of) one request.  0 = fully sent, EAGAIN = blocked,
 * otherwise an ibv_wc_status to fail the WQE with. */
static int rc_tx_wqe(struct sv_context *ctx, struct sv_qp *qp,
		     struct sv_swqe *w)
{
	bool is_read = w->opcode == IBV_WR_RDMA_READ;
	uint32_t payload = is_read ? 0 : w->len;

	if (!w->tx_off && !(w->send_flags & IBV_SEND_INLINE) &&
	    !sges_ok(ctx, qp->ibqp.pd, w->sge, w->num_sge, is_read))
		return IBV_WC_LOC_PROT_ERR;
	do {
		struct iovec iov[SV_MAX_SGE + 1];
		struct sv_pkt p;
		uint32_t chunk = payload - w->tx_off, max = seg_size(qp);
		int n = 1;

		if (chunk > max)
			chunk = max;
		fill_pkt(ctx, qp, &p, req_op(w->opcode));
		p.psn = w->psn;
		p.msg_len = w->len;
		p.offset = w->tx_off;
		p.imm = w->imm;
		p.raddr = w->raddr;
		p.rkey = w->rkey;
		if (!w->tx_off)
			p.flags |= SV_F_FIRST;
		if (w->tx_off + chunk == payload)
			p.flags |= SV_F_LAST;
		if (w->opcode == IBV_WR_SEND_WITH_IMM ||
		    w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
			p.flags |= SV_F_IMM;
		if (w->send_flags & IBV_SEND_SOLICITED)
			p.flags |= SV_F_SOLICITED;
		if (qp->ack_pending && qp->ibqp.qp_type == IBV_QPT_RC) {
			p.flags |= SV_F_PIGGY;
			p.ack_psn = qp->ack_psn;
		}
		iov[0].iov_base = &p;
		iov[0].iov_len = offsetof(struct sv_pkt, grh);
		if (w->send_flags & IBV_SEND_INLINE) {
			iov[1].iov_base = w->inl + w->tx_off;
			iov[1].iov_len = chunk;
			n = 2;
		} else {
			n += gather_iov(w->sge, w->num_sge, w->tx_off, chunk,
					iov + 1);
		}
		if (send_pkt(qp, &qp->peer, iov, n) < 0) {
			if (errno == EAGAIN)
				return EAGAIN;
			if (!lost_on_fabric(errno))
				return IBV_WC_LOC_QP_OP_ERR;
		}
		if (p.flags & SV_F_PIGGY) {
			qp->ack_pending = false;
			qp->ack_count = 0;
		}
		w->tx_off += chunk;
	} while (w->tx_off < payload);
	return 0;
}

static void qp_tx_requests(struct sv_context *ctx, struct sv_qp *qp);
static void rd_resp_tx(struct sv_context *ctx, struct sv_qp *qp);

/* Move requests and ACKs onto the wire and run the requester's timers. */
static void qp_tx(struct sv_context *ctx, struct sv_qp *qp)
{
	qp_tx_requests(ctx, qp);
	rd_resp_tx(ctx, qp);
	/* an ACK no reply picked up goes out on its own */
	if (qp->ack_pending && (ctx->in_thread || sv_now_ns() >= qp->ack_due_ns))
		ack_flush(ctx, qp);
}

static void qp_tx_requests(struct sv_context *ctx, struct sv_qp *qp)
{
	enum ibv_qp_type type = qp->ibqp.qp_type;
	uint64_t now = 0;

	if (qp->ibqp.state != IBV_QPS_RTS && qp->ibqp.state != IBV_QPS_SQD)
		return;
	if (qp->retx_at_ns) {
		now = sv_now_ns();
		if (now < qp->retx_at_ns)
			return;
		qp->retx_at_ns = 0;
	}
	/* SQD: requests already accepted finish, new ones wait */
	while (qp->sq_tx != qp->sq_tail && qp->ibqp.state == IBV_QPS_RTS) {
		struct sv_swqe *w = sq_slot(qp, qp->sq_tx);
		int ret;

		if (type == IBV_QPT_UD) {
			if (ud_tx(ctx, qp, w) == EAGAIN)
				break;
			qp->sq_head = ++qp->sq_tx;
			continue;
		}
		if (w->fail) {
			/* errors are reported in order: wait until every
			 * earlier request has been acknowledged */
			if (qp->sq_head != qp->sq_tx)
				break;
			sq_fail_head(ctx, qp, w->fail);
			return;
		}
		ret = rc_tx_wqe(ctx, qp, w);
		if (ret == EAGAIN)
			break;
		if (ret) {
			w->fail = ret;
			continue;
		}
		qp->sq_tx++;
		if (type == IBV_QPT_UC) {
			complete_send(ctx, qp, w, IBV_WC_SUCCESS);
			qp->sq_head = qp->sq_tx;
		} else if (!qp->ack_deadline_ns && timeout_ns(qp->attr.timeout)) {
			qp->ack_deadline_ns = (now ? now : sv_now_ns()) +
					      timeout_ns(qp->attr.timeout);
		}
	}
	if (type != IBV_QPT_RC || qp->sq_head == qp->sq_tx ||
	    !qp->ack_deadline_ns)
		return;
	if (!now)
		now = sv_now_ns();
	if (now < qp->ack_deadline_ns)
		return;
	/* transport timeout: nothing came back for the oldest request */
	ctx->stats.timeouts++;
	if (qp->retry_left-- <= 0) {
		sq_fail_head(ctx, qp, IBV_WC_RETRY_EXC_ERR);
		return;
	}
	sq_rewind(qp);
}

static struct sv_swqe *sq_find_psn(struct sv_qp *qp, uint32_t psn)
{
	for (uint32_t i = qp->sq_head; i != qp->sq_tx; i++)
		if (sq_slot(qp, i)->psn == psn)
			return sq_slot(qp, i);
	return NULL;
}

static enum ibv_wc_status nak_status(uint8_t syndrome)
{
	switch (syndrome) {
	case SV_NAK_REM_ACCESS:
		return IBV_WC_REM_ACCESS_ERR;
	case SV_NAK_INV_REQ:
		return IBV_WC_REM_INV_REQ_ERR;
	default:
		return IBV_WC_REM_OP_ERR;
	}
}

static void rc_requester_rx(struct sv_context *ctx, struct sv_qp *qp,
			    const struct sv_pkt *p, const uint8_t *data,
			    uint32_t len)
{
	struct sv_swqe *w;

	if (qp->ibqp.state != IBV_QPS_RTS && qp->ibqp.state != IBV_QPS_SQD)
		return;
	switch (p->op) {
	case SV_OP_ACK:
		sq_ack_upto(ctx, qp, p->psn);
		break;
	case SV_OP_READ_RESP:
		w = sq_find_psn(qp, p->psn);
		if (!w || w->opcode != IBV_WR_RDMA_READ ||
		    p->offset + len > w->len || p->offset != w->rx_off)
			return;	/* stray, duplicate or out of order */
		scatter(w->sge, w->num_sge, p->offset, data, len);
		w->rx_off += len;
		if (w->rx_off == w->len)
			sq_ack_upto(ctx, qp, p->psn);
		break;
	case SV_OP_NAK:
		if (!sq_find_psn(qp, p->psn))
			return;		/* stale */
		/* everything before the NAKed request was executed */
		sq_ack_upto(ctx, qp, (p->psn - 1) & 0xffffff);
		if (p->syndrome != SV_NAK_RNR) {
			sq_fail_head(ctx, qp, nak_status(p->syndrome));
			return;
		}
		if (qp->attr.rnr_retry != 7 && qp->rnr_left-- <= 0) {
			sq_fail_head(ctx, qp, IBV_WC_RNR_RETRY_EXC_ERR);
			return;
		}
		sq_rewind(qp);
		qp->retx_at_ns = sv_now_ns() + rnr_timer_ns(p->aux);
		break;
	}
}

/* ---- RC / UC responder ---- */

static void responder_fatal(struct sv_context *ctx, struct sv_qp *qp,
			    uint32_t psn, uint8_t syndrome,
			    enum ibv_event_type ev)
{
	send_nak(ctx, qp, psn, syndrome);
	sv_async_push(ctx, ev, qp);
	sv_qp_to_error(ctx, qp);
}

static void rx_message_done(struct sv_context *ctx, struct sv_qp *qp,
			    const struct sv_pkt *p)
{
	qp->rx_active = false;
	qp->rx_have_wqe = false;
	qp->epsn = (qp->epsn + 1) & 0xffffff;
	send_ack(ctx, qp, p->psn, false);
}

/* First packet of a SEND or WRITE: claim resources or NAK. */
static bool rx_start(struct sv_context *ctx, struct sv_qp *qp,
		     const struct sv_pkt *p)
{
	bool need_wqe = p->op == SV_OP_SEND || (p->flags & SV_F_IMM);

	if (qp->rx_active) {
		/* the requester restarted this message: reuse what we hold */
		return true;
	}
	/* the spec (C9-88): a zero-length WRITE is not checked against its
	 * R_Key, which may be anything (UCX flushes with rkey 0) */
	if (p->op == SV_OP_WRITE && p->msg_len) {
		qp->rx_mr = rkey_check(ctx, qp, p->rkey, p->raddr, p->msg_len,
				       IBV_ACCESS_REMOTE_WRITE);
		if (!qp->rx_mr) {
			responder_fatal(ctx, qp, p->psn, SV_NAK_REM_ACCESS,
					IBV_EVENT_QP_ACCESS_ERR);
			return false;
		}
	}
	if (need_wqe && rq_empty(qp)) {
		if (qp->ibqp.qp_type == IBV_QPT_RC) {
			ctx->stats.rnr_naks++;
			send_nak(ctx, qp, p->psn, SV_NAK_RNR);
			qp->rx_drop = true;
		} else {
			/* UC: the message is silently lost */
			qp->epsn = (qp->epsn + 1) & 0xffffff;
		}
		return false;
	}
	if (need_wqe) {
		rq_take(ctx, qp, &qp->rx_wqe);
		qp->rx_have_wqe = true;
		if (p->op == SV_OP_SEND &&
		    p->msg_len > sge_total(qp->rx_wqe.sge, qp->rx_wqe.num_sge)) {
			complete_recv(ctx, qp, &qp->rx_wqe, IBV_WC_LOC_LEN_ERR,
				      p, IBV_WC_RECV, 0, 0);
			qp->rx_have_wqe = false;
			responder_fatal(ctx, qp, p->psn, SV_NAK_INV_REQ,
					IBV_EVENT_QP_REQ_ERR);
			return false;
		}
		if (p->op == SV_OP_SEND &&
		    !sges_ok(ctx, qp->ibqp.pd, qp->rx_wqe.sge,
			     qp->rx_wqe.num_sge, true)) {
			complete_recv(ctx, qp, &qp->rx_wqe, IBV_WC_LOC_PROT_ERR,
				      p, IBV_WC_RECV, 0, 0);
			qp->rx_have_wqe = false;
			responder_fatal(ctx, qp, p->psn, SV_NAK_REM_OP,
					IBV_EVENT_QP_FATAL);
			return false;
		}
	}
	qp->rx_active = true;
	return true;
}

/* Send what is left of the queued READ responses, oldest first, until the
 * requester's queue is full; the rest goes on a later progress pass. */
static void rd_resp_tx(struct sv_context *ctx, struct sv_qp *qp)
{
	if (!qp_can_receive(qp))
		qp->rd_count = 0;
	while (qp->rd_count) {
		struct sv_rd_resp *e = &qp->rd[qp->rd_head];
		struct sv_mr *mr = e->len ? rkey_check(ctx, qp, e->rkey, e->raddr,
				e->len, IBV_ACCESS_REMOTE_READ) : NULL;
		bool first = true;

		/* MR gone meanwhile: the requester times out, asks again
		 * and gets its NAK.  A zero-length READ is one empty packet. */
		while ((mr && e->off < e->len) || (!e->len && first)) {
			struct sv_pkt r;
			uint32_t chunk = e->len - e->off, max = seg_size(qp);
			struct iovec iov[2];

			if (chunk > max)
				chunk = max;
			fill_pkt(ctx, qp, &r, SV_OP_READ_RESP);
			r.psn = e->psn;
			r.msg_len = e->len;
			r.offset = e->off;
			if (e->off + chunk == e->len)
				r.flags = SV_F_LAST;
			iov[0].iov_base = &r;
			iov[0].iov_len = offsetof(struct sv_pkt, grh);
			iov[1].iov_base = chunk ? mr_ptr(mr, e->raddr + e->off) : NULL;
			iov[1].iov_len = chunk;
			if (send_pkt(qp, &qp->peer, iov, 2) < 0) {
				if (errno == EAGAIN)
					return;
				break;	/* peer gone: it will time out */
			}
			e->off += chunk;
			first = false;
		}
		qp->rd_head = (qp->rd_head + 1) % SV_MAX_RD_ATOMIC;
		qp->rd_count--;
	}
}

static void rx_read(struct sv_context *ctx, struct sv_qp *qp,
		    const struct sv_pkt *p)
{
	struct sv_mr *mr = p->msg_len ? rkey_check(ctx, qp, p->rkey, p->raddr,
			p->msg_len, IBV_ACCESS_REMOTE_READ) : NULL;
	struct sv_rd_resp *e;

	if (qp->ibqp.qp_type != IBV_QPT_RC) {
		responder_fatal(ctx, qp, p->psn, SV_NAK_INV_REQ,
				IBV_EVENT_QP_REQ_ERR);
		return;
	}
	if (!mr && p->msg_len) {
		responder_fatal(ctx, qp, p->psn, SV_NAK_REM_ACCESS,
				IBV_EVENT_QP_ACCESS_ERR);
		return;
	}
	/* a repeated request whose answer is still queued: nothing new */
	for (uint32_t i = 0; i < qp->rd_count; i++)
		if (qp->rd[(qp->rd_head + i) % SV_MAX_RD_ATOMIC].psn == p->psn)
			return;
	/* more READs in flight than responder resources: dropped, the
	 * requester asks again after its timeout */
	if (qp->rd_count == SV_MAX_RD_ATOMIC)
		return;
	e = &qp->rd[(qp->rd_head + qp->rd_count++) % SV_MAX_RD_ATOMIC];
	*e = (struct sv_rd_resp){ .psn = p->psn, .rkey = p->rkey,
				  .len = p->msg_len, .raddr = p->raddr };
	qp->epsn = (qp->epsn + 1) & 0xffffff;
	rd_resp_tx(ctx, qp);
}

static void rc_responder_rx(struct sv_context *ctx, struct sv_qp *qp,
			    const struct sv_pkt *p, const uint8_t *data,
			    uint32_t len)
{
	int32_t d;

	if (!qp_can_receive(qp) || qp->ibqp.qp_type == IBV_QPT_UD ||
	    p->src_qpn != qp->attr.dest_qp_num ||
	    p->src_lid != qp->attr.ah_attr.dlid) {
		ctx->stats.state_drops++;
		return;
	}
	d = psn_diff(p->psn, qp->epsn);
	if (d < 0) {
		ctx->stats.dup_reqs++;
		/* duplicate of an executed request: answer it again */
		if (p->op == SV_OP_READ_REQ) {
			uint32_t save = qp->epsn;

			rx_read(ctx, qp, p);
			qp->epsn = save;
		} else if (p->flags & SV_F_LAST) {
			send_ack(ctx, qp, (qp->epsn - 1) & 0xffffff, true);
		}
		return;
	}
	if (d > 0) {
		ctx->stats.ooo_drops++;
		if (qp->ibqp.qp_type != IBV_QPT_UC || !(p->flags & SV_F_FIRST))
			return;
		/* UC: earlier messages were lost, start over here */
		qp->epsn = p->psn;
		qp->rx_active = false;
	}
	if (qp->rx_drop) {
		if (!(p->flags & SV_F_FIRST))
			return;
		qp->rx_drop = false;
	}
	if (p->op == SV_OP_READ_REQ) {
		rx_read(ctx, qp, p);
		return;
	}
	if ((p->flags & SV_F_FIRST) && !rx_start(ctx, qp, p))
		return;
	if (!qp->rx_active || p->offset + len > p->msg_len)
		return;
	if (p->op == SV_OP_SEND)
		scatter(qp->rx_wqe.sge, qp->rx_wqe.num_sge, p->offset, data,
			len);
	else if (len)
		dma_write(mr_ptr(qp->rx_mr, p->raddr + p->offset), data, len);
	if (!(p->flags & SV_F_LAST))
		return;
	if (qp->rx_have_wqe)
		complete_recv(ctx, qp, &qp->rx_wqe, IBV_WC_SUCCESS, p,
			      p->op == SV_OP_SEND ? IBV_WC_RECV :
			      IBV_WC_RECV_RDMA_WITH_IMM, p->msg_len, 0);
	rx_message_done(ctx, qp, p);
}

/* ---- progress ---- */

static void handle_pkt(struct sv_context *ctx, struct sv_qp *qp,
		       const uint8_t *buf, size_t n)
{
	const struct sv_pkt *p = (const struct sv_pkt *)buf;
	size_t hlen = offsetof(struct sv_pkt, grh);
	const uint8_t *data;

	if (n < hlen || p->dst_qpn != qp->ibqp.qp_num)
		return;
	if (p->flags & SV_F_GRH) {
		hlen = sizeof(*p);
		if (n < hlen)
			return;
	}
	data = buf + hlen;
	n -= hlen;
	switch (p->op) {
	case SV_OP_UD:
		ud_rx(ctx, qp, p, data, n);
		break;
	case SV_OP_SEND:
	case SV_OP_WRITE:
	case SV_OP_READ_REQ:
		if ((p->flags & SV_F_PIGGY) && qp->ibqp.qp_type == IBV_QPT_RC &&
		    p->src_qpn == qp->attr.dest_qp_num &&
		    (qp->ibqp.state == IBV_QPS_RTS ||
		     qp->ibqp.state == IBV_QPS_SQD))
			sq_ack_upto(ctx, qp, p->ack_psn);
		rc_responder_rx(ctx, qp, p, data, n);
		break;
	case SV_OP_ACK:
	case SV_OP_NAK:
	case SV_OP_READ_RESP:
		if (qp->ibqp.qp_type == IBV_QPT_RC &&
		    p->src_qpn == qp->attr.dest_qp_num)
			rc_requester_rx(ctx, qp, p, data, n);
		break;
	}
}

/* Drain a socket: one recvmmsg per batch, so an empty socket costs one
 * system call and a busy one no extra call to find out it is empty. */
static void fd_rx(struct sv_context *ctx, struct sv_qp *qp, int fd)
{
	struct mmsghdr msgs[SV_RX_BATCH];
	struct iovec iov[SV_RX_BATCH];

	for (int i = 0; i < SV_RX_BATCH; i++) {
		iov[i].iov_base = ctx->rxbuf + (size_t)i * ctx->rxbuf_len;
		iov[i].iov_len = ctx->rxbuf_len;
		memset(&msgs[i].msg_hdr, 0, sizeof(msgs[i].msg_hdr));
		msgs[i].msg_hdr.msg_iov = &iov[i];
		msgs[i].msg_hdr.msg_iovlen = 1;
	}
	/* bounded so one busy QP cannot starve the others */
	for (int budget = 8; budget; budget--) {
		int n = recvmmsg(fd, msgs, SV_RX_BATCH, MSG_DONTWAIT, NULL);

		if (n <= 0)
			break;
		for (int i = 0; i < n && qp->fd >= 0; i++)
			handle_pkt(ctx, qp, iov[i].iov_base, msgs[i].msg_len);
		if (n < SV_RX_BATCH)
			break;
	}
}

/*
 * Called with ctx->lock held.  AF_UNIX sockets are drained every pass;
 * UDP sockets (other hosts) every SV_UDP_POLL_EVERY passes and on every
 * pass of the progress thread, which keeps an idle local poll at one
 * system call per QP.
 */
void sv_progress(struct sv_context *ctx)
{
	bool udp = ctx->in_thread || ++ctx->passes % SV_UDP_POLL_EVERY == 0;

	for (struct sv_qp *qp = ctx->qps; qp; qp = qp->next) {
		fd_rx(ctx, qp, qp->fd);
		if (udp)
			fd_rx(ctx, qp, qp->ufd);
	}
	for (struct sv_qp *qp = ctx->qps; qp; qp = qp->next)
		qp_tx(ctx, qp);
}

/* How long the progress thread may sleep, in ms (lock held). */
static int next_timeout_ms(struct sv_context *ctx)
{
	uint64_t now = sv_now_ns(), next = now + 100000000ull;

	for (struct sv_qp *qp = ctx->qps; qp; qp = qp->next) {
		if (qp->ack_pending || qp->rd_count ||
		    (qp->sq_tx != qp->sq_tail && !qp->retx_at_ns))
			return 1;	/* back-pressured: retry soon */
		if (qp->retx_at_ns && qp->retx_at_ns < next)
			next = qp->retx_at_ns;
		if (qp->ack_deadline_ns && qp->sq_head != qp->sq_tx &&
		    qp->ack_deadline_ns < next)
			next = qp->ack_deadline_ns;
	}
	return next <= now ? 0 : (int)((next - now + 999999) / 1000000);
}

static void *progress_thread(void *arg)
{
	struct sv_context *ctx = arg;
	struct epoll_event ev[16];
	int timeout;

	dma_checked = true;

	while (!atomic_load(&ctx->stop)) {
		uint64_t v;

		if (sv_now_ns() - atomic_load(&ctx->app_active_ns) <
		    SV_APP_ACTIVE_NS) {
			/* the application is polling: it makes progress
			 * itself, just look again a little later */
			struct pollfd pfd = { .fd = ctx->wakefd,
					      .events = POLLIN };

			if (poll(&pfd, 1, 1) > 0 &&
			    read(ctx->wakefd, &v, sizeof(v)) < 0)
				continue;
			continue;
		}
		/* progress first: the application may have left work behind
		 * (a delayed ACK) when it stopped polling */
		pthread_mutex_lock(&ctx->lock);
		ctx->in_thread = true;
		sv_progress(ctx);
		ctx->in_thread = false;
		timeout = next_timeout_ms(ctx);
		pthread_mutex_unlock(&ctx->lock);
		if (epoll_wait(ctx->epfd, ev, 16, timeout) < 0 &&
		    errno != EINTR)
			break;
		if (read(ctx->wakefd, &v, sizeof(v)) < 0)
			(void)0;	/* nothing pending: fine */
	}
	return NULL;
}

int sv_progress_start(struct sv_context *ctx)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
	int err;

	ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (ctx->epfd < 0)
		return errno;
	ctx->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (ctx->wakefd < 0 ||
	    epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ctx->wakefd, &ev)) {
		err = errno;
		goto err;
	}
	err = pthread_create(&ctx->thread, NULL, progress_thread, ctx);
	if (err)
		goto err;
	ctx->thread_started = true;
	return 0;
err:
	if (ctx->wakefd >= 0)
		close(ctx->wakefd);
	close(ctx->epfd);
	return err;
}

void sv_progress_wake(struct sv_context *ctx)
{
	uint64_t one = 1;

	if (write(ctx->wakefd, &one, sizeof(one)) < 0)
		(void)0;	/* counter saturated: already awake */
}

void sv_progress_stop(struct sv_context *ctx)
{
	if (ctx->thread_started) {
		atomic_store(&ctx->stop, true);
		sv_progress_wake(ctx);
		pthread_join(ctx->thread, NULL);
	}
	close(ctx->wakefd);
	close(ctx->epfd);
}

/* ---- data-path verbs ---- */

static int check_send_wr(struct sv_qp *qp, struct ibv_send_wr *wr)
{
	enum ibv_qp_type t = qp->ibqp.qp_type;

	if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_send_sge)
		return EINVAL;
	switch (wr->opcode) {
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
		break;
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		if (t == IBV_QPT_UD)
			return EINVAL;
		break;
	case IBV_WR_RDMA_READ:
		if (t != IBV_QPT_RC || (wr->send_flags & IBV_SEND_INLINE))
			return EINVAL;
		break;
	default:
		return EINVAL;	/* atomics, MW binds, ...: not offered */
	}
	if (t == IBV_QPT_UD && !wr->wr.ud.ah)
		return EINVAL;
	if (qp->sq_tail - qp->sq_head >= qp->sq_cap)
		return ENOMEM;
	return 0;
}

static int fill_swqe(struct sv_qp *qp, struct sv_swqe *w,
		     struct ibv_send_wr *wr)
{
	w->wr_id = wr->wr_id;
	w->opcode = wr->opcode;
	w->send_flags = wr->send_flags;
	w->imm = wr->imm_data;
	w->num_sge = wr->num_sge;
	memcpy(w->sge, wr->sg_list, wr->num_sge * sizeof(*w->sge));
	w->len = sge_total(wr->sg_list, wr->num_sge);
	w->tx_off = w->rx_off = 0;
	w->first_tx_ns = 0;
	w->fail = 0;
	if (wr->send_flags & IBV_SEND_INLINE) {
		uint32_t off = 0;

		if (w->len > SV_MAX_INLINE)
			return EINVAL;
		/* the buffer may be reused as soon as post_send returns */
		for (int i = 0; i < wr->num_sge; i++) {
			memcpy(w->inl + off,
			       (void *)(uintptr_t)wr->sg_list[i].addr,
			       wr->sg_list[i].length);
			off += wr->sg_list[i].length;
		}
	}
	if (qp->ibqp.qp_type == IBV_QPT_UD) {
		w->av = to_sah(wr->wr.ud.ah)->attr;
		w->rqpn = wr->wr.ud.remote_qpn;
		/* high bit set: use the QP's own Q_Key (IB spec 10.2.5) */
		w->rqkey = (wr->wr.ud.remote_qkey & 0x80000000u) ?
			   qp->attr.qkey : wr->wr.ud.remote_qkey;
	} else {
		w->raddr = wr->wr.rdma.remote_addr;
		w->rkey = wr->wr.rdma.rkey;
		w->psn = qp->next_psn;
		qp->next_psn = (qp->next_psn + 1) & 0xffffff;
	}
	return 0;
}

static void count_send(struct sv_context *ctx, const struct sv_qp *qp,
		       const struct sv_swqe *w)
{
	switch (qp->ibqp.qp_type) {
	case IBV_QPT_RC:
		ctx->stats.rc_wrs++;
		ctx->stats.rc_bytes += w->len;
		break;
	case IBV_QPT_UC:
		ctx->stats.uc_wrs++;
		ctx->stats.uc_bytes += w->len;
		break;
	default:
		ctx->stats.ud_wrs++;
		ctx->stats.ud_bytes += w->len;
		break;
	}
}

int sv_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
		 struct ibv_send_wr **bad_wr)
{
	struct sv_context *ctx = to_sctx(ibqp->context);
	struct sv_qp *qp = to_sqp(ibqp);
	enum ibv_qp_state st;
	int err = 0;

	pthread_mutex_lock(&ctx->lock);
	st = qp->ibqp.state;
	if (st != IBV_QPS_RTS && st != IBV_QPS_SQD && st != IBV_QPS_ERR &&
	    st != IBV_QPS_SQE) {
		err = EINVAL;
		*bad_wr = wr;
		goto out;
	}
	for (; wr; wr = wr->next) {
		err = check_send_wr(qp, wr);
		if (!err)
			err = fill_swqe(qp, sq_slot(qp, qp->sq_tail), wr);
		if (err) {
			*bad_wr = wr;
			break;
		}
		count_send(ctx, qp, sq_slot(qp, qp->sq_tail));
		qp->sq_tail++;
	}
	if (st == IBV_QPS_ERR)
		sv_qp_flush(ctx, qp);	/* posted in ERR: flushed at once */
	else
		qp_tx(ctx, qp);
out:
	pthread_mutex_unlock(&ctx->lock);
	return err;
}

int sv_rq_post(struct sv_rq *rq, struct ibv_recv_wr *wr,
	       struct ibv_recv_wr **bad_wr)
{
	for (; wr; wr = wr->next) {
		struct sv_rwqe *r;

		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > rq->max_sge) {
			*bad_wr = wr;
			return EINVAL;
		}
		if (rq->count == rq->cap) {
			*bad_wr = wr;
			return ENOMEM;
		}
		r = &rq->wqe[(rq->head + rq->count) % rq->cap];
		r->wr_id = wr->wr_id;
		r->num_sge = wr->num_sge;
		memcpy(r->sge, wr->sg_list, wr->num_sge * sizeof(*r->sge));
		rq->count++;
	}
	return 0;
}

int sv_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
		 struct ibv_recv_wr **bad_wr)
{
	struct sv_context *ctx = to_sctx(ibqp->context);
	struct sv_qp *qp = to_sqp(ibqp);
	int err;

	pthread_mutex_lock(&ctx->lock);
	if (qp->ibqp.srq || qp->ibqp.state == IBV_QPS_RESET) {
		*bad_wr = wr;
		err = EINVAL;
	} else {
		err = sv_rq_post(&qp->rq, wr, bad_wr);
		if (qp->ibqp.state == IBV_QPS_ERR)
			sv_qp_flush(ctx, qp);
	}
	pthread_mutex_unlock(&ctx->lock);
	return err;
}

int sv_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr,
		     struct ibv_recv_wr **bad_wr)
{
	struct sv_context *ctx = to_sctx(ibsrq->context);
	int err;

	pthread_mutex_lock(&ctx->lock);
	err = sv_rq_post(&to_ssrq(ibsrq)->rq, wr, bad_wr);
	pthread_mutex_unlock(&ctx->lock);
	return err;
}

int sv_poll_cq(struct ibv_cq *ibcq, int ne, struct ibv_wc *wc)
{
	struct sv_context *ctx = to_sctx(ibcq->context);
	struct sv_cq *cq = to_scq(ibcq);
	int n = 0;

	atomic_store_explicit(&ctx->app_active_ns, sv_now_ns(),
			      memory_order_relaxed);
	pthread_mutex_lock(&ctx->lock);
	if (!cq->count)
		sv_progress(ctx);
	while (n < ne && cq->count) {
		wc[n++] = cq->ring[cq->head];
		cq->head = (cq->head + 1) % cq->size;
		cq->count--;
	}
	pthread_mutex_unlock(&ctx->lock);
	return n;
}
