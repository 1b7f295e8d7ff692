/*
 * The data path, reached through the virtual context's ops table: each
 * call passes the gate, translates the virtual ids in the work requests
 * (copied to the stack: the application's lists are not touched) and
 * completions, and keeps the counts the checkpoint drain needs.  No lock
 * and no system call unless an id is seen for the first time.
 */
#include <errno.h>
#include <string.h>
#include "ib.h"

#define CHUNK 16	/* work requests translated per real post */

static void real_sges(struct ibv_sge *out, const struct ibv_sge *in, int n)
{
	for (int i = 0; i < n; i++) {
		out[i] = in[i];
		out[i].lkey = ib_real_lkey(in[i].lkey);
	}
}

static int is_signaled(const struct ib_qp *qp, const struct ibv_send_wr *wr)
{
	return qp->init.sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
}

/* Up to CHUNK requests from wr, translated into the arrays. */
static int translate_sends(struct ib_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr *out,
			   struct ibv_sge (*sges)[IB_MAX_SGE], int *signaled)
{
	int n = 0;

	*signaled = 0;
	for (; wr && n < CHUNK; wr = wr->next, n++) {
		struct ibv_send_wr *w = &out[n];

		*w = *wr;
		w->next = wr->next && n + 1 < CHUNK ? &out[n + 1] : NULL;
		if (wr->num_sge > IB_MAX_SGE)
			return -EINVAL;
		if (!(wr->send_flags & IBV_SEND_INLINE)) {	/* inline data needs no key */
			real_sges(sges[n], wr->sg_list, wr->num_sge);
			w->sg_list = sges[n];
		}
		if (qp->ibv.qp_type == IBV_QPT_UD) {
			w->wr.ud.ah = ((struct ib_ah *)wr->wr.ud.ah)->real;
			w->wr.ud.remote_qpn = ib_real_qpn(wr->wr.ud.remote_qpn);
		} else if (wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ||
			   wr->opcode == IBV_WR_RDMA_READ) {
			w->wr.rdma.rkey = ib_real_rkey(qp, wr->wr.rdma.rkey);
		} else if (wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
			   wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
			w->wr.atomic.rkey = ib_real_rkey(qp, wr->wr.atomic.rkey);
		}
		*signaled += is_signaled(qp, wr);
	}
	return n;
}

int ib_post_send(struct ibv_qp *vqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct ib_qp *qp = (struct ib_qp *)vqp;
	struct ibv_send_wr out[CHUNK];
	struct ibv_sge sges[CHUNK][IB_MAX_SGE];
	int err = 0;

	ib_enter();
	while (wr && !err) {
		struct ibv_send_wr *real_bad = NULL;
		int signaled, n = translate_sends(qp, wr, out, sges, &signaled);

		if (n < 0) {
			*bad = wr;
			err = -n;
			break;
		}
		atomic_fetch_add_explicit(&qp->sends_pending, signaled, memory_order_relaxed);
		err = qp->real->context->ops.post_send(qp->real, out, &real_bad);
		if (err) {
			int at = real_bad ? (int)(real_bad - out) : 0;

			for (int i = at; i < n; i++)	/* not posted: not pending */
				atomic_fetch_sub_explicit(&qp->sends_pending, is_signaled(qp, &out[i]),
							  memory_order_relaxed);
			for (int i = 0; i < at; i++)
				wr = wr->next;
			*bad = wr;
			break;
		}
		for (int i = 0; i < n; i++)
			wr = wr->next;
	}
	ib_leave();
	return err;
}

/* One receive, translated and posted to a real queue. */
static int post_one_recv(struct ibv_qp *qp, struct ibv_srq *srq, const struct ibv_recv_wr *wr)
{
	struct ibv_sge sges[IB_MAX_SGE];
	struct ibv_recv_wr real = *wr, *real_bad;

	if (wr->num_sge > IB_MAX_SGE)
		return EINVAL;
	real_sges(sges, wr->sg_list, wr->num_sge);
	real.sg_list = sges;
	real.next = NULL;
	return qp ? qp->context->ops.post_recv(qp, &real, &real_bad) :
		    srq->context->ops.post_srq_recv(srq, &real, &real_bad);
}

int ib_repost_recv(struct ibv_qp *real, const struct ib_recv *r)
{
	struct ibv_recv_wr wr = { .wr_id = r->wr_id, .sg_list = (struct ibv_sge *)r->sge,
				  .num_sge = r->num_sge };

	return post_one_recv(real, NULL, &wr);
}

int ib_repost_srq_recv(struct ibv_srq *real, const struct ib_recv *r)
{
	struct ibv_recv_wr wr = { .wr_id = r->wr_id, .sg_list = (struct ibv_sge *)r->sge,
				  .num_sge = r->num_sge };

	return post_one_recv(NULL, real, &wr);
}

/* Receives are logged before they are posted: their completion may come
 * before the post returns. */
int ib_post_recv(struct ibv_qp *vqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct ib_qp *qp = (struct ib_qp *)vqp;
	int err = 0;

	ib_enter();
	for (; wr; wr = wr->next) {
		err = ib_recv_log_push(&qp->posted, wr);
		if (!err) {
			err = post_one_recv(qp->real, NULL, wr);
			if (err)	/* the newest entry goes again */
				qp->posted.tail = (qp->posted.tail + qp->posted.cap - 1) % qp->posted.cap;
		}
		if (err) {
			*bad = wr;
			break;
		}
	}
	ib_leave();
	return err;
}

int ib_post_srq_recv(struct ibv_srq *vsrq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct ib_srq *srq = (struct ib_srq *)vsrq;
	int err = 0;

	ib_enter();
	pthread_mutex_lock(&srq->post_lock);
	for (; wr; wr = wr->next) {
		err = ib_recv_log_push(&srq->posted, wr);
		if (!err) {
			err = post_one_recv(NULL, srq->real, wr);
			if (err)
				srq->posted.tail = (srq->posted.tail + srq->posted.cap - 1) %
						   srq->posted.cap;
		}
		if (err) {
			*bad = wr;
			break;
		}
	}
	pthread_mutex_unlock(&srq->post_lock);
	ib_leave();
	return err;
}

/* Whether a completion is a receive's.  An error completion's opcode is
 * undefined: then the queue it came from, or the receive log, tells. */
static int is_receive(const struct ib_cq *cq, const struct ib_qp *qp, const struct ibv_wc *wc)
{
	if (wc->status == IBV_WC_SUCCESS)
		return !!(wc->opcode & IBV_WC_RECV);
	if (qp->init.send_cq != qp->init.recv_cq)
		return &cq->ibv == qp->init.recv_cq;
	if (qp->init.srq) {
		struct ib_srq *srq = (struct ib_srq *)qp->init.srq;
		int found = 0;

		pthread_mutex_lock(&srq->post_lock);
		for (unsigned i = 0; i < ib_recv_log_count(&srq->posted) && !found; i++)
			found = ib_recv_log_at(&srq->posted, i)->wr_id == wc->wr_id;
		pthread_mutex_unlock(&srq->post_lock);
		return found;
	}
	return ib_recv_log_count(&qp->posted) &&
	       ib_recv_log_at(&qp->posted, 0)->wr_id == wc->wr_id;
}

/* A completion from the device: account for it, and make it virtual. */
static void complete(const struct ib_cq *cq, struct ibv_wc *wc)
{
	struct ib_qp *qp = ib_qp_of_real(wc->qp_num);
	int ok = wc->status == IBV_WC_SUCCESS;

	if (!qp)
		return;
	if (is_receive(cq, qp, wc)) {
		if (qp->init.srq) {
			struct ib_srq *srq = (struct ib_srq *)qp->init.srq;

			pthread_mutex_lock(&srq->post_lock);
			if (ok && qp->ibv.qp_type == IBV_QPT_UD)
				ib_virtual_grh(qp, wc);	/* while the receive is in the log */
			ib_recv_log_remove(&srq->posted, wc->wr_id);
			pthread_mutex_unlock(&srq->post_lock);
		} else {
			if (ok && qp->ibv.qp_type == IBV_QPT_UD)
				ib_virtual_grh(qp, wc);
			ib_recv_log_pop_front(&qp->posted);
		}
		if (ok && atomic_load_explicit(&ib_ids.remap, memory_order_relaxed) &&
		    qp->ibv.qp_type == IBV_QPT_UD)
			ib_virtual_source(&wc->slid, &wc->src_qp);
	} else if (atomic_load_explicit(&qp->sends_pending, memory_order_relaxed) > 0) {
		atomic_fetch_sub_explicit(&qp->sends_pending, 1, memory_order_relaxed);
	}
	wc->qp_num = qp->ibv.qp_num;
}

int ib_poll_real(struct ib_cq *cq, int n, struct ibv_wc *wc)
{
	int got = cq->real->context->ops.poll_cq(cq->real, n, wc);

	for (int i = 0; i < got; i++)
		complete(cq, &wc[i]);
	return got;
}

int ib_poll_cq(struct ibv_cq *vcq, int n, struct ibv_wc *wc)
{
	struct ib_cq *cq = (struct ib_cq *)vcq;
	int got = 0, more;

	ib_enter();
	if (__builtin_expect(cq->pending_head != cq->pending_tail, 0)) {
		/* completions from a checkpoint: pollers take them in turn */
		pthread_mutex_lock(&cq->ibv.mutex);
		while (cq->pending_head != cq->pending_tail && got < n) {
			wc[got++] = cq->pending[cq->pending_head];
			cq->pending_head = (cq->pending_head + 1) % cq->pending_cap;
		}
		pthread_mutex_unlock(&cq->ibv.mutex);
	}
	more = got < n ? ib_poll_real(cq, n - got, wc + got) : 0;
	ib_leave();
	if (more < 0)
		return got ? got : more;
	return got + more;
}

int ib_req_notify_cq(struct ibv_cq *vcq, int solicited_only)
{
	struct ib_cq *cq = (struct ib_cq *)vcq;
	int err;

	ib_enter();
	cq->armed = 1;
	cq->solicited_only = solicited_only;
	err = cq->real->context->ops.req_notify_cq(cq->real, solicited_only);
	ib_leave();
	return err;
}

/* The context's ops: the data path above, everything else unsupported. */
static int no_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *bind)
{
	return EOPNOTSUPP;
}

static struct ibv_mw *no_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	errno = EOPNOTSUPP;
	return NULL;
}

static int no_dealloc_mw(struct ibv_mw *mw)
{
	return EOPNOTSUPP;
}

void ib_ctx_init_ops(struct ib_ctx *ctx)
{
	memset(&ctx->ibv.ops, 0, sizeof(ctx->ibv.ops));
	ctx->ibv.ops.post_send = ib_post_send;
	ctx->ibv.ops.post_recv = ib_post_recv;
	ctx->ibv.ops.post_srq_recv = ib_post_srq_recv;
	ctx->ibv.ops.poll_cq = ib_poll_cq;
	ctx->ibv.ops.req_notify_cq = ib_req_notify_cq;
	ctx->ibv.ops.alloc_mw = no_alloc_mw;
	ctx->ibv.ops.bind_mw = no_bind_mw;
	ctx->ibv.ops.dealloc_mw = no_dealloc_mw;
}
