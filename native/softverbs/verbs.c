/*
 * softverbs: resource verbs -- PD, MR, completion channels, CQs, SRQs,
 * QPs (with the IB state machine), AHs and async events.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include "sv.h"

static void init_obj_sync(pthread_mutex_t *m, pthread_cond_t *c)
{
	pthread_mutex_init(m, NULL);
	pthread_cond_init(c, NULL);
}

/* ---- PD ---- */

SV_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *ibctx)
{
	static _Atomic uint32_t handles;
	struct sv_pd *pd = calloc(1, sizeof(*pd));

	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	pd->ibpd.context = ibctx;
	pd->ibpd.handle = ++handles;
	return &pd->ibpd;
}

SV_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	free(pd);
	return 0;
}

/* ---- MR ---- */

#define SV_ACCESS_KNOWN (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
			 IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC | \
			 IBV_ACCESS_ZERO_BASED | IBV_ACCESS_RELAXED_ORDERING | \
			 IBV_ACCESS_OPTIONAL_RANGE)

static int check_access(int access)
{
	if (access & ~SV_ACCESS_KNOWN)
		return EINVAL;
	/* IB spec: remote write/atomic need local write */
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE))
		return EINVAL;
	return 0;
}

struct sv_mr *sv_mr_lookup(struct sv_context *ctx, uint32_t key)
{
	uint32_t idx = key >> 8;

	if (idx >= ctx->nmrs || !ctx->mrs[idx] ||
	    ctx->mrs[idx]->ibmr.lkey != key)
		return NULL;
	return ctx->mrs[idx];
}

static int mr_table_insert(struct sv_context *ctx, struct sv_mr *mr)
{
	uint32_t idx;
	uint8_t tag;

	for (idx = 1; idx < ctx->nmrs && ctx->mrs[idx]; idx++)
		;
	if (idx >= ctx->nmrs) {
		uint32_t n = ctx->nmrs ? ctx->nmrs * 2 : 64;
		struct sv_mr **t;

		if (n > SV_MAX_MR)
			return ENOMEM;
		t = realloc(ctx->mrs, n * sizeof(*t));
		if (!t)
			return ENOMEM;
		memset(t + ctx->nmrs, 0, (n - ctx->nmrs) * sizeof(*t));
		ctx->mrs = t;
		ctx->nmrs = n;
	}
	/* the low byte varies so a stale key of a freed slot is rejected */
	if (getrandom(&tag, 1, 0) != 1)
		tag = (uint8_t)sv_now_ns();
	mr->ibmr.lkey = mr->ibmr.rkey = (idx << 8) | tag;
	ctx->mrs[idx] = mr;
	return 0;
}

SV_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr,
					  size_t length, uint64_t iova,
					  unsigned int access)
{
	struct sv_context *ctx = to_sctx(pd->context);
	struct sv_mr *mr;
	int err = check_access((int)access);

	if (!err && !addr && length)
		err = EINVAL;
	if (err) {
		errno = err;
		return NULL;
	}
	mr = calloc(1, sizeof(*mr));
	if (!mr) {
		errno = ENOMEM;
		return NULL;
	}
	mr->ibmr.context = pd->context;
	mr->ibmr.pd = pd;
	mr->ibmr.addr = addr;
	mr->ibmr.length = length;
	mr->access = (int)access;
	mr->iova = (access & IBV_ACCESS_ZERO_BASED) ? 0 : iova;
	pthread_mutex_lock(&ctx->lock);
	err = mr_table_insert(ctx, mr);
	mr->ibmr.handle = mr->ibmr.lkey;
	pthread_mutex_unlock(&ctx->lock);
	if (err) {
		free(mr);
		errno = err;
		return NULL;
	}
	return &mr->ibmr;
}

#undef ibv_reg_mr
#undef ibv_reg_mr_iova
SV_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr,
				    size_t length, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, access);
}

SV_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr,
					 size_t length, uint64_t iova,
					 int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, iova, access);
}

SV_EXPORT int ibv_dereg_mr(struct ibv_mr *ibmr)
{
	struct sv_context *ctx = to_sctx(ibmr->context);
	uint32_t idx = ibmr->lkey >> 8;

	pthread_mutex_lock(&ctx->lock);
	if (idx < ctx->nmrs && ctx->mrs[idx] == to_smr(ibmr))
		ctx->mrs[idx] = NULL;
	pthread_mutex_unlock(&ctx->lock);
	free(ibmr);
	return 0;
}

SV_EXPORT int ibv_rereg_mr(struct ibv_mr *ibmr, int flags, struct ibv_pd *pd,
			   void *addr, size_t length, int access)
{
	struct sv_context *ctx = to_sctx(ibmr->context);
	struct sv_mr *mr = to_smr(ibmr);

	if (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED || !flags)
		return IBV_REREG_MR_ERR_INPUT;
	if ((flags & IBV_REREG_MR_CHANGE_ACCESS) && check_access(access))
		return IBV_REREG_MR_ERR_INPUT;
	if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && !addr && length)
		return IBV_REREG_MR_ERR_INPUT;
	pthread_mutex_lock(&ctx->lock);
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		mr->ibmr.addr = addr;
		mr->ibmr.length = length;
		mr->iova = (uintptr_t)addr;
	}
	if (flags & IBV_REREG_MR_CHANGE_PD)
		mr->ibmr.pd = pd;
	if (flags & IBV_REREG_MR_CHANGE_ACCESS)
		mr->access = access;
	pthread_mutex_unlock(&ctx->lock);
	return 0;
}

/* ---- completion channels ---- */

SV_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ibctx)
{
	struct sv_channel *ch = calloc(1, sizeof(*ch));

	if (!ch) {
		errno = ENOMEM;
		return NULL;
	}
	/* A semaphore eventfd: one count per queued CQ event, so the fd is
	 * readable exactly while ibv_get_cq_event() has something to return
	 * and one read consumes one event. */
	ch->ibch.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	if (ch->ibch.fd < 0) {
		free(ch);
		return NULL;
	}
	ch->ibch.context = ibctx;
	ch->ibch.refcnt = 0;
	return &ch->ibch;
}

SV_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *ibch)
{
	struct sv_context *ctx = to_sctx(ibch->context);
	struct sv_channel *ch = to_sch(ibch);

	pthread_mutex_lock(&ctx->lock);
	if (ibch->refcnt) {
		pthread_mutex_unlock(&ctx->lock);
		return EBUSY;
	}
	pthread_mutex_unlock(&ctx->lock);
	close(ibch->fd);
	free(ch->events);
	free(ch);
	return 0;
}

static void channel_push(struct sv_channel *ch, struct sv_cq *cq)
{
	uint64_t one = 1;

	if (ch->nevents == ch->cap) {
		int n = ch->cap ? ch->cap * 2 : 16;
		struct sv_cq **e = realloc(ch->events, n * sizeof(*e));

		if (!e)
			return;
		ch->events = e;
		ch->cap = n;
	}
	ch->events[ch->nevents++] = cq;
	if (write(ch->ibch.fd, &one, sizeof(one)) != sizeof(one))
		ch->nevents--;
}

SV_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *ibch,
			       struct ibv_cq **cq, void **cq_context)
{
	struct sv_context *ctx = to_sctx(ibch->context);
	struct sv_channel *ch = to_sch(ibch);
	struct sv_cq *scq;
	uint64_t v;

	/* The progress thread turns arriving packets into completions and
	 * events; make sure it is not idling because we polled recently. */
	atomic_store(&ctx->app_active_ns, 0);
	sv_progress_wake(ctx);
	if (read(ibch->fd, &v, sizeof(v)) != sizeof(v))
		return -1;
	pthread_mutex_lock(&ctx->lock);
	if (!ch->nevents) {
		pthread_mutex_unlock(&ctx->lock);
		errno = EAGAIN;
		return -1;
	}
	scq = ch->events[0];
	memmove(ch->events, ch->events + 1,
		--ch->nevents * sizeof(*ch->events));
	scq->comp_events_reported++;
	pthread_mutex_unlock(&ctx->lock);
	*cq = &scq->ibcq;
	*cq_context = scq->ibcq.cq_context;
	return 0;
}

SV_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}

/* ---- async events ---- */

enum sv_async_kind { SV_ASYNC_PORT, SV_ASYNC_CQ, SV_ASYNC_SRQ, SV_ASYNC_QP };

static enum sv_async_kind async_kind(enum ibv_event_type type)
{
	switch (type) {
	case IBV_EVENT_CQ_ERR:
		return SV_ASYNC_CQ;
	case IBV_EVENT_SRQ_LIMIT_REACHED:
	case IBV_EVENT_SRQ_ERR:
		return SV_ASYNC_SRQ;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		return SV_ASYNC_QP;
	default:
		return SV_ASYNC_PORT;
	}
}

/* The object an event names (its verbs struct is first in ours). */
static void *async_object(const struct ibv_async_event *ev)
{
	switch (async_kind(ev->event_type)) {
	case SV_ASYNC_CQ:
		return ev->element.cq;
	case SV_ASYNC_SRQ:
		return ev->element.srq;
	case SV_ASYNC_QP:
		return ev->element.qp;
	default:
		return NULL;
	}
}

static uint32_t *async_reported(const struct ibv_async_event *ev)
{
	switch (async_kind(ev->event_type)) {
	case SV_ASYNC_CQ:
		return &to_scq(ev->element.cq)->events_reported;
	case SV_ASYNC_SRQ:
		return &to_ssrq(ev->element.srq)->events_reported;
	case SV_ASYNC_QP:
		return &to_sqp(ev->element.qp)->events_reported;
	default:
		return NULL;
	}
}

/* Called with ctx->lock held. */
void sv_async_push(struct sv_context *ctx, enum ibv_event_type type, void *obj)
{
	struct ibv_async_event ev = { .event_type = type };
	uint64_t one = 1;

	switch (async_kind(type)) {
	case SV_ASYNC_CQ:
		ev.element.cq = obj;
		break;
	case SV_ASYNC_SRQ:
		ev.element.srq = obj;
		break;
	case SV_ASYNC_QP:
		ev.element.qp = obj;
		break;
	default:
		ev.element.port_num = 1;
		break;
	}
	if (ctx->naq == ctx->aqcap) {
		int n = ctx->aqcap ? ctx->aqcap * 2 : 16;
		struct sv_async *q = realloc(ctx->aq, n * sizeof(*q));

		if (!q)
			return;
		ctx->aq = q;
		ctx->aqcap = n;
	}
	ctx->aq[ctx->naq++].ev = ev;
	if (write(ctx->vctx.context.async_fd, &one, sizeof(one)) != sizeof(one))
		ctx->naq--;
}

/* What the kernel does when an object is destroyed (ib_uverbs): its events
 * not read yet are dropped, and the destroy waits until those already read are
 * acknowledged (async_wait_acked); a reader never holds a
 * pointer to a freed object.  Called with ctx->lock held. */
static void async_forget(struct sv_context *ctx, void *obj)
{
	int kept = 0;

	for (int i = 0; i < ctx->naq; i++)
		if (async_object(&ctx->aq[i].ev) != obj)
			ctx->aq[kept++] = ctx->aq[i];
	ctx->naq = kept;
	/* the eventfd keeps its counts: a reader woken for a dropped event
	 * finds the queue empty and waits for the next (or gets EAGAIN) */
}

static void async_wait_acked(pthread_mutex_t *m, pthread_cond_t *c,
			     const uint32_t *completed, uint32_t reported)
{
	pthread_mutex_lock(m);
	while (*completed != reported)
		pthread_cond_wait(c, m);
	pthread_mutex_unlock(m);
}

SV_EXPORT int ibv_get_async_event(struct ibv_context *ibctx,
				  struct ibv_async_event *event)
{
	struct sv_context *ctx = to_sctx(ibctx);
	uint32_t *reported;
	uint64_t v;

	for (;;) {
		if (read(ibctx->async_fd, &v, sizeof(v)) != sizeof(v))
			return -1;	/* EAGAIN on a non-blocking fd */
		pthread_mutex_lock(&ctx->lock);
		if (ctx->naq)
			break;
		pthread_mutex_unlock(&ctx->lock);	/* its object was destroyed */
	}
	*event = ctx->aq[0].ev;
	memmove(ctx->aq, ctx->aq + 1, --ctx->naq * sizeof(*ctx->aq));
	reported = async_reported(event);
	if (reported)
		++*reported;
	pthread_mutex_unlock(&ctx->lock);
	return 0;
}

SV_EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
	pthread_mutex_t *m;
	pthread_cond_t *c;
	uint32_t *counter;

	switch (async_kind(event->event_type)) {
	case SV_ASYNC_CQ:
		m = &event->element.cq->mutex;
		c = &event->element.cq->cond;
		counter = &event->element.cq->async_events_completed;
		break;
	case SV_ASYNC_SRQ:
		m = &event->element.srq->mutex;
		c = &event->element.srq->cond;
		counter = &event->element.srq->events_completed;
		break;
	case SV_ASYNC_QP:
		m = &event->element.qp->mutex;
		c = &event->element.qp->cond;
		counter = &event->element.qp->events_completed;
		break;
	default:
		return;
	}
	pthread_mutex_lock(m);
	++*counter;
	pthread_cond_signal(c);
	pthread_mutex_unlock(m);
}

/* ---- CQ ---- */

int sv_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct sv_context *ctx = to_sctx(ibcq->context);

	pthread_mutex_lock(&ctx->lock);
	to_scq(ibcq)->armed = solicited_only ? 2 : 1;
	pthread_mutex_unlock(&ctx->lock);
	return 0;
}

void sv_cq_push(struct sv_context *ctx, struct sv_cq *cq,
		const struct ibv_wc *wc, bool solicited)
{
	if (cq->count == cq->size) {
		/* A real CQ overruns: report it, the entry is lost. */
		if (!cq->overflowed)
			sv_async_push(ctx, IBV_EVENT_CQ_ERR, cq);
		cq->overflowed = true;
		return;
	}
	cq->ring[(cq->head + cq->count) % cq->size] = *wc;
	cq->count++;
	if (cq->armed == 1 || (cq->armed == 2 && (solicited ||
						   wc->status != IBV_WC_SUCCESS))) {
		cq->armed = 0;
		if (cq->ibcq.channel)
			channel_push(to_sch(cq->ibcq.channel), cq);
	}
}

SV_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *ibctx, int cqe,
				       void *cq_context,
				       struct ibv_comp_channel *channel,
				       int comp_vector)
{
	struct sv_context *ctx = to_sctx(ibctx);
	struct sv_cq *cq;

	if (cqe < 1 || cqe > SV_MAX_CQE || comp_vector < 0 ||
	    comp_vector >= ibctx->num_comp_vectors) {
		errno = EINVAL;
		return NULL;
	}
	cq = calloc(1, sizeof(*cq));
	if (!cq)
		goto err;
	cq->size = cqe;
	cq->ring = calloc(cq->size, sizeof(*cq->ring));
	if (!cq->ring)
		goto err;
	cq->ibcq.context = ibctx;
	cq->ibcq.channel = channel;
	cq->ibcq.cq_context = cq_context;
	cq->ibcq.cqe = cqe;
	init_obj_sync(&cq->ibcq.mutex, &cq->ibcq.cond);
	if (channel) {
		pthread_mutex_lock(&ctx->lock);
		channel->refcnt++;
		pthread_mutex_unlock(&ctx->lock);
	}
	return &cq->ibcq;
err:
	if (cq)
		free(cq->ring);
	free(cq);
	errno = ENOMEM;
	return NULL;
}

SV_EXPORT int ibv_resize_cq(struct ibv_cq *ibcq, int cqe)
{
	struct sv_context *ctx = to_sctx(ibcq->context);
	struct sv_cq *cq = to_scq(ibcq);
	struct ibv_wc *ring;
	int ret = 0;

	if (cqe < 1 || cqe > SV_MAX_CQE)
		return EINVAL;
	pthread_mutex_lock(&ctx->lock);
	if (cqe < cq->count) {
		ret = EINVAL;
		goto out;
	}
	ring = calloc(cqe, sizeof(*ring));
	if (!ring) {
		ret = ENOMEM;
		goto out;
	}
	for (int i = 0; i < cq->count; i++)
		ring[i] = cq->ring[(cq->head + i) % cq->size];
	free(cq->ring);
	cq->ring = ring;
	cq->head = 0;
	cq->size = cqe;
	ibcq->cqe = cqe;
out:
	pthread_mutex_unlock(&ctx->lock);
	return ret;
}

/* Drop CQEs of a QP being destroyed, as hardware drivers clean the CQ. */
static void cq_clean(struct sv_cq *cq, uint32_t qpn)
{
	int kept = 0;

	for (int i = 0; i < cq->count; i++) {
		struct ibv_wc wc = cq->ring[(cq->head + i) % cq->size];

		if (wc.qp_num != qpn)
			cq->ring[(cq->head + kept++) % cq->size] = wc;
	}
	cq->count = kept;
}

static void channel_forget(struct sv_channel *ch, struct sv_cq *cq)
{
	int kept = 0;

	for (int i = 0; i < ch->nevents; i++)
		if (ch->events[i] != cq)
			ch->events[kept++] = ch->events[i];
	ch->nevents = kept;
}

SV_EXPORT int ibv_destroy_cq(struct ibv_cq *ibcq)
{
	struct sv_context *ctx = to_sctx(ibcq->context);
	struct sv_cq *cq = to_scq(ibcq);
	uint32_t reported, comp_reported;

	pthread_mutex_lock(&ctx->lock);
	for (struct sv_qp *qp = ctx->qps; qp; qp = qp->next) {
		if (qp->ibqp.send_cq == ibcq || qp->ibqp.recv_cq == ibcq) {
			pthread_mutex_unlock(&ctx->lock);
			return EBUSY;
		}
	}
	if (ibcq->channel) {
		channel_forget(to_sch(ibcq->channel), cq);
		ibcq->channel->refcnt--;
	}
	async_forget(ctx, cq);
	reported = cq->events_reported;
	comp_reported = cq->comp_events_reported;
	pthread_mutex_unlock(&ctx->lock);
	/* as libibverbs' destroy: every event read must have been acked */
	async_wait_acked(&ibcq->mutex, &ibcq->cond,
			 &ibcq->async_events_completed, reported);
	async_wait_acked(&ibcq->mutex, &ibcq->cond,
			 &ibcq->comp_events_completed, comp_reported);
	free(cq->ring);
	free(cq);
	return 0;
}

/* ---- SRQ ---- */

static int rq_init(struct sv_rq *rq, uint32_t max_wr, uint32_t max_sge)
{
	if (!max_wr || max_wr > SV_MAX_QP_WR || max_sge > SV_MAX_SGE)
		return EINVAL;
	rq->wqe = calloc(max_wr, sizeof(*rq->wqe));
	if (!rq->wqe)
		return ENOMEM;
	rq->cap = max_wr;
	rq->max_sge = max_sge ? max_sge : 1;
	rq->head = rq->count = 0;
	return 0;
}

SV_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd,
					 struct ibv_srq_init_attr *attr)
{
	struct sv_srq *srq = calloc(1, sizeof(*srq));
	int err;

	if (!srq) {
		errno = ENOMEM;
		return NULL;
	}
	err = rq_init(&srq->rq, attr->attr.max_wr, attr->attr.max_sge);
	if (!err && attr->attr.srq_limit > attr->attr.max_wr)
		err = EINVAL;
	if (err) {
		free(srq->rq.wqe);
		free(srq);
		errno = err;
		return NULL;
	}
	srq->ibsrq.context = pd->context;
	srq->ibsrq.srq_context = attr->srq_context;
	srq->ibsrq.pd = pd;
	init_obj_sync(&srq->ibsrq.mutex, &srq->ibsrq.cond);
	srq->limit = attr->attr.srq_limit;
	return &srq->ibsrq;
}

SV_EXPORT int ibv_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr,
			     int mask)
{
	struct sv_context *ctx = to_sctx(ibsrq->context);
	struct sv_srq *srq = to_ssrq(ibsrq);
	int ret = 0;

	if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT))
		return EINVAL;
	pthread_mutex_lock(&ctx->lock);
	if (mask & IBV_SRQ_MAX_WR) {
		struct sv_rq nrq;

		if (attr->max_wr < srq->rq.count) {
			ret = EINVAL;
			goto out;
		}
		ret = rq_init(&nrq, attr->max_wr, srq->rq.max_sge);
		if (ret)
			goto out;
		for (uint32_t i = 0; i < srq->rq.count; i++)
			nrq.wqe[i] = srq->rq.wqe[(srq->rq.head + i) %
						 srq->rq.cap];
		nrq.count = srq->rq.count;
		free(srq->rq.wqe);
		srq->rq = nrq;
	}
	if (mask & IBV_SRQ_LIMIT) {
		if (attr->srq_limit > srq->rq.cap) {
			ret = EINVAL;
			goto out;
		}
		srq->limit = attr->srq_limit;
	}
out:
	pthread_mutex_unlock(&ctx->lock);
	return ret;
}

SV_EXPORT int ibv_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
	struct sv_srq *srq = to_ssrq(ibsrq);

	attr->max_wr = srq->rq.cap;
	attr->max_sge = srq->rq.max_sge;
	attr->srq_limit = srq->limit;
	return 0;
}

SV_EXPORT int ibv_destroy_srq(struct ibv_srq *ibsrq)
{
	struct sv_context *ctx = to_sctx(ibsrq->context);
	struct sv_srq *srq = to_ssrq(ibsrq);
	uint32_t reported;

	pthread_mutex_lock(&ctx->lock);
	for (struct sv_qp *qp = ctx->qps; qp; qp = qp->next) {
		if (qp->ibqp.srq == ibsrq) {
			pthread_mutex_unlock(&ctx->lock);
			return EBUSY;
		}
	}
	async_forget(ctx, srq);
	reported = srq->events_reported;
	pthread_mutex_unlock(&ctx->lock);
	async_wait_acked(&ibsrq->mutex, &ibsrq->cond,
			 &ibsrq->events_completed, reported);
	free(srq->rq.wqe);
	free(srq);
	return 0;
}

/* ---- QP ---- */

static int check_qp_cap(const struct ibv_qp_init_attr *a)
{
	const struct ibv_qp_cap *c = &a->cap;

	if (c->max_send_wr > SV_MAX_QP_WR || c->max_send_sge > SV_MAX_SGE ||
	    c->max_inline_data > SV_MAX_INLINE)
		return EINVAL;
	if (!a->srq && (c->max_recv_wr > SV_MAX_QP_WR ||
			c->max_recv_sge > SV_MAX_SGE))
		return EINVAL;
	return 0;
}

SV_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd,
				       struct ibv_qp_init_attr *attr)
{
	struct sv_context *ctx = to_sctx(pd->context);
	struct sv_qp *qp;
	int err;

	if (attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UC &&
	    attr->qp_type != IBV_QPT_UD) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	err = check_qp_cap(attr);
	if (!err && (!attr->send_cq || !attr->recv_cq))
		err = EINVAL;
	if (err) {
		errno = err;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	qp->fd = qp->ufd = -1;
	qp->cap = attr->cap;
	qp->cap.max_inline_data = SV_MAX_INLINE;
	if (!qp->cap.max_send_sge)
		qp->cap.max_send_sge = 1;
	if (attr->srq) {
		qp->cap.max_recv_wr = 0;
		qp->cap.max_recv_sge = 0;
	}
	qp->sq_cap = qp->cap.max_send_wr ? qp->cap.max_send_wr : 1;
	qp->sq = calloc(qp->sq_cap, sizeof(*qp->sq));
	if (!qp->sq) {
		err = ENOMEM;
		goto err;
	}
	if (!attr->srq) {
		err = rq_init(&qp->rq, qp->cap.max_recv_wr ?
			      qp->cap.max_recv_wr : 1, qp->cap.max_recv_sge);
		if (err)
			goto err;
	}
	qp->sq_sig_all = attr->sq_sig_all;
	qp->ibqp.context = pd->context;
	qp->ibqp.qp_context = attr->qp_context;
	qp->ibqp.pd = pd;
	qp->ibqp.send_cq = attr->send_cq;
	qp->ibqp.recv_cq = attr->recv_cq;
	qp->ibqp.srq = attr->srq;
	qp->ibqp.qp_type = attr->qp_type;
	qp->ibqp.state = IBV_QPS_RESET;
	init_obj_sync(&qp->ibqp.mutex, &qp->ibqp.cond);

	pthread_mutex_lock(&ctx->lock);
	err = sv_qp_bind(ctx, qp);
	if (!err) {
		qp->next = ctx->qps;
		ctx->qps = qp;
		ctx->nqps++;
	}
	pthread_mutex_unlock(&ctx->lock);
	if (err)
		goto err;
	qp->ibqp.handle = qp->ibqp.qp_num;
	attr->cap = qp->cap;
	return &qp->ibqp;
err:
	free(qp->rq.wqe);
	free(qp->sq);
	free(qp);
	errno = err;
	return NULL;
}

/*
 * Required and optional attribute masks per transition, from the IB spec
 * (table "QP state transition attributes", also the kernel's
 * qp_state_table).  Index [cur][next][type]: type 0 = UD, 1 = UC, 2 = RC.
 */
enum { T_UD, T_UC, T_RC, T_NUM };

struct sv_transition {
	bool valid;
	uint32_t req[T_NUM];
	uint32_t opt[T_NUM];
};

#define S(x) IBV_QPS_##x
#define M(x) IBV_QP_##x

static const struct sv_transition sv_qp_table[IBV_QPS_ERR + 1][IBV_QPS_ERR + 1] = {
	[S(RESET)] = {
		[S(RESET)] = { .valid = true },
		[S(INIT)] = { .valid = true,
			.req = {
				[T_UD] = M(PKEY_INDEX) | M(PORT) | M(QKEY),
				[T_UC] = M(PKEY_INDEX) | M(PORT) | M(ACCESS_FLAGS),
				[T_RC] = M(PKEY_INDEX) | M(PORT) | M(ACCESS_FLAGS),
			} },
	},
	[S(INIT)] = {
		[S(RESET)] = { .valid = true },
		[S(ERR)] = { .valid = true },
		[S(INIT)] = { .valid = true,
			.opt = {
				[T_UD] = M(PKEY_INDEX) | M(PORT) | M(QKEY),
				[T_UC] = M(PKEY_INDEX) | M(PORT) | M(ACCESS_FLAGS),
				[T_RC] = M(PKEY_INDEX) | M(PORT) | M(ACCESS_FLAGS),
			} },
		[S(RTR)] = { .valid = true,
			.req = {
				[T_UC] = M(AV) | M(PATH_MTU) | M(DEST_QPN) |
					 M(RQ_PSN),
				[T_RC] = M(AV) | M(PATH_MTU) | M(DEST_QPN) |
					 M(RQ_PSN) | M(MAX_DEST_RD_ATOMIC) |
					 M(MIN_RNR_TIMER),
			},
			.opt = {
				[T_UD] = M(PKEY_INDEX) | M(QKEY),
				[T_UC] = M(ALT_PATH) | M(ACCESS_FLAGS) |
					 M(PKEY_INDEX),
				[T_RC] = M(ALT_PATH) | M(ACCESS_FLAGS) |
					 M(PKEY_INDEX),
			} },
	},
	[S(RTR)] = {
		[S(RESET)] = { .valid = true },
		[S(ERR)] = { .valid = true },
		[S(RTS)] = { .valid = true,
			.req = {
				[T_UD] = M(SQ_PSN),
				[T_UC] = M(SQ_PSN),
				[T_RC] = M(TIMEOUT) | M(RETRY_CNT) |
					 M(RNR_RETRY) | M(SQ_PSN) |
					 M(MAX_QP_RD_ATOMIC),
			},
			.opt = {
				[T_UD] = M(CUR_STATE) | M(QKEY),
				[T_UC] = M(CUR_STATE) | M(ALT_PATH) |
					 M(ACCESS_FLAGS) | M(PATH_MIG_STATE),
				[T_RC] = M(CUR_STATE) | M(ALT_PATH) |
					 M(ACCESS_FLAGS) | M(MIN_RNR_TIMER) |
					 M(PATH_MIG_STATE),
			} },
	},
	[S(RTS)] = {
		[S(RESET)] = { .valid = true },
		[S(ERR)] = { .valid = true },
		[S(RTS)] = { .valid = true,
			.opt = {
				[T_UD] = M(CUR_STATE) | M(QKEY),
				[T_UC] = M(CUR_STATE) | M(ACCESS_FLAGS) |
					 M(ALT_PATH) | M(PATH_MIG_STATE),
				[T_RC] = M(CUR_STATE) | M(ACCESS_FLAGS) |
					 M(ALT_PATH) | M(PATH_MIG_STATE) |
					 M(MIN_RNR_TIMER),
			} },
		[S(SQD)] = { .valid = true,
			.opt = {
				[T_UD] = M(EN_SQD_ASYNC_NOTIFY),
				[T_UC] = M(EN_SQD_ASYNC_NOTIFY),
				[T_RC] = M(EN_SQD_ASYNC_NOTIFY),
			} },
	},
	[S(SQD)] = {
		[S(RESET)] = { .valid = true },
		[S(ERR)] = { .valid = true },
		[S(RTS)] = { .valid = true,
			.opt = {
				[T_UD] = M(CUR_STATE) | M(QKEY),
				[T_UC] = M(CUR_STATE) | M(ALT_PATH) |
					 M(ACCESS_FLAGS) | M(PATH_MIG_STATE),
				[T_RC] = M(CUR_STATE) | M(ALT_PATH) |
					 M(ACCESS_FLAGS) | M(MIN_RNR_TIMER) |
					 M(PATH_MIG_STATE),
			} },
		[S(SQD)] = { .valid = true,
			.opt = {
				[T_UD] = M(PKEY_INDEX) | M(QKEY),
				[T_UC] = M(AV) | M(ALT_PATH) | M(ACCESS_FLAGS) |
					 M(PKEY_INDEX) | M(PATH_MIG_STATE),
				[T_RC] = M(PORT) | M(AV) | M(TIMEOUT) |
					 M(RETRY_CNT) | M(RNR_RETRY) |
					 M(MAX_QP_RD_ATOMIC) |
					 M(MAX_DEST_RD_ATOMIC) | M(ALT_PATH) |
					 M(ACCESS_FLAGS) | M(PKEY_INDEX) |
					 M(MIN_RNR_TIMER) | M(PATH_MIG_STATE),
			} },
	},
	[S(SQE)] = {
		[S(RESET)] = { .valid = true },
		[S(ERR)] = { .valid = true },
		[S(RTS)] = { .valid = true,
			.opt = {
				[T_UD] = M(CUR_STATE) | M(QKEY),
				[T_UC] = M(CUR_STATE) | M(ACCESS_FLAGS),
			} },
	},
	[S(ERR)] = {
		[S(RESET)] = { .valid = true },
		[S(ERR)] = { .valid = true },
	},
};

static int qp_type_index(enum ibv_qp_type t)
{
	return t == IBV_QPT_UD ? T_UD : t == IBV_QPT_UC ? T_UC : T_RC;
}

static bool transition_ok(enum ibv_qp_state cur, enum ibv_qp_state next,
			  enum ibv_qp_type type, int mask)
{
	const struct sv_transition *t;
	int ti = qp_type_index(type);
	uint32_t req, opt;

	if (cur > IBV_QPS_ERR || next > IBV_QPS_ERR)
		return false;
	t = &sv_qp_table[cur][next];
	if (!t->valid)
		return false;
	/* SQE is reachable from/to RTS only for unreliable transports */
	if (cur == IBV_QPS_SQE && next == IBV_QPS_RTS && ti == T_RC)
		return false;
	req = t->req[ti];
	opt = t->opt[ti];
	if ((mask & req) != req)
		return false;
	if (mask & ~(req | opt | IBV_QP_STATE))
		return false;
	return true;
}

static int check_ah_attr(const struct ibv_ah_attr *ah)
{
	if (ah->port_num != 1)
		return EINVAL;
	if (!ah->dlid || ah->dlid >= 0xc000)	/* unicast LIDs only */
		return EINVAL;
	if (ah->is_global && ah->grh.sgid_index != 0)
		return EINVAL;
	return 0;
}

static int check_attr_values(struct sv_qp *qp, const struct ibv_qp_attr *a,
			     int mask)
{
	if ((mask & IBV_QP_PORT) && a->port_num != 1)
		return EINVAL;
	if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0)
		return EINVAL;
	if ((mask & IBV_QP_PATH_MTU) &&
	    (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096))
		return EINVAL;
	if ((mask & IBV_QP_AV) && check_ah_attr(&a->ah_attr))
		return EINVAL;
	if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) &&
	    a->max_rd_atomic > SV_MAX_RD_ATOMIC)
		return EINVAL;
	if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) &&
	    a->max_dest_rd_atomic > SV_MAX_RD_ATOMIC)
		return EINVAL;
	if ((mask & IBV_QP_ACCESS_FLAGS) &&
	    (a->qp_access_flags & ~(IBV_ACCESS_LOCAL_WRITE |
				    IBV_ACCESS_REMOTE_WRITE |
				    IBV_ACCESS_REMOTE_READ |
				    IBV_ACCESS_REMOTE_ATOMIC)))
		return EINVAL;
	if ((mask & IBV_QP_DEST_QPN) && a->dest_qp_num > 0xffffff)
		return EINVAL;
	if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7)
		return EINVAL;
	if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7)
		return EINVAL;
	if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31)
		return EINVAL;
	if ((mask & IBV_QP_MIN_RNR_TIMER) && a->min_rnr_timer > 31)
		return EINVAL;
	if ((mask & IBV_QP_CUR_STATE) && a->cur_qp_state != qp->ibqp.state)
		return EINVAL;
	return 0;
}

static void apply_attrs(struct sv_qp *qp, const struct ibv_qp_attr *a,
			int mask)
{
	struct ibv_qp_attr *q = &qp->attr;

#define COPY(bit, field) do { if (mask & (bit)) q->field = a->field; } while (0)
	COPY(IBV_QP_ACCESS_FLAGS, qp_access_flags);
	COPY(IBV_QP_PKEY_INDEX, pkey_index);
	COPY(IBV_QP_PORT, port_num);
	COPY(IBV_QP_QKEY, qkey);
	COPY(IBV_QP_AV, ah_attr);
	COPY(IBV_QP_PATH_MTU, path_mtu);
	COPY(IBV_QP_TIMEOUT, timeout);
	COPY(IBV_QP_RETRY_CNT, retry_cnt);
	COPY(IBV_QP_RNR_RETRY, rnr_retry);
	COPY(IBV_QP_MAX_QP_RD_ATOMIC, max_rd_atomic);
	COPY(IBV_QP_ALT_PATH, alt_ah_attr);
	COPY(IBV_QP_MIN_RNR_TIMER, min_rnr_timer);
	COPY(IBV_QP_MAX_DEST_RD_ATOMIC, max_dest_rd_atomic);
	COPY(IBV_QP_PATH_MIG_STATE, path_mig_state);
	COPY(IBV_QP_DEST_QPN, dest_qp_num);
	COPY(IBV_QP_EN_SQD_ASYNC_NOTIFY, en_sqd_async_notify);
#undef COPY
	if (mask & IBV_QP_RQ_PSN)
		q->rq_psn = a->rq_psn & 0xffffff;
	if (mask & IBV_QP_SQ_PSN)
		q->sq_psn = a->sq_psn & 0xffffff;
}

/* Back to RESET: every queue is emptied without completions. */
static void qp_reset(struct sv_qp *qp)
{
	qp->sq_head = qp->sq_tx = qp->sq_tail = 0;
	qp->rq.head = qp->rq.count = 0;
	qp->rx_active = qp->rx_drop = qp->rx_have_wqe = false;
	qp->ack_pending = false;
	qp->ack_count = 0;
	qp->rd_head = qp->rd_count = 0;
	qp->retx_at_ns = qp->ack_deadline_ns = 0;
	memset(&qp->attr, 0, sizeof(qp->attr));
}

static void enter_state(struct sv_context *ctx, struct sv_qp *qp,
			enum ibv_qp_state next)
{
	enum ibv_qp_state cur = qp->ibqp.state;

	qp->ibqp.state = next;
	switch (next) {
	case IBV_QPS_RESET:
		qp_reset(qp);
		break;
	case IBV_QPS_RTR:
		if (cur == IBV_QPS_INIT) {
			qp->epsn = qp->attr.rq_psn;
			if (qp->ibqp.qp_type != IBV_QPT_UD)
				sv_resolve(ctx, qp->attr.ah_attr.dlid,
					   qp->attr.dest_qp_num, &qp->peer);
		}
		break;
	case IBV_QPS_RTS:
		if (cur == IBV_QPS_RTR) {
			qp->next_psn = qp->attr.sq_psn;
			qp->retry_left = qp->attr.retry_cnt;
			qp->rnr_left = qp->attr.rnr_retry;
		}
		break;
	case IBV_QPS_SQD:
		/* nothing is ever left in flight long enough to drain:
		 * report the drain at once if asked */
		if (qp->attr.en_sqd_async_notify)
			sv_async_push(ctx, IBV_EVENT_SQ_DRAINED, qp);
		break;
	case IBV_QPS_ERR:
		sv_qp_flush(ctx, qp);
		/* an SRQ-attached QP tells its owner, once, that it will
		 * consume no more of the SRQ's WQEs */
		if (qp->ibqp.srq && cur != IBV_QPS_ERR)
			sv_async_push(ctx, IBV_EVENT_QP_LAST_WQE_REACHED, qp);
		break;
	default:
		break;
	}
}

SV_EXPORT int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
			    int mask)
{
	struct sv_context *ctx = to_sctx(ibqp->context);
	struct sv_qp *qp = to_sqp(ibqp);
	enum ibv_qp_state cur, next;
	int err;

	pthread_mutex_lock(&ctx->lock);
	cur = qp->ibqp.state;
	next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
	err = check_attr_values(qp, attr, mask);
	if (!err && !transition_ok(cur, next, ibqp->qp_type, mask))
		err = EINVAL;
	if (!err) {
		if (next == IBV_QPS_RESET || next == IBV_QPS_ERR)
			sv_qp_ack_flush(ctx, qp);
		if (next == IBV_QPS_RESET)
			qp_reset(qp);
		apply_attrs(qp, attr, mask);
		if (next != cur || next == IBV_QPS_RESET || next == IBV_QPS_ERR)
			enter_state(ctx, qp, next);
	}
	pthread_mutex_unlock(&ctx->lock);
	return err;
}

void sv_qp_to_error(struct sv_context *ctx, struct sv_qp *qp)
{
	if (qp->ibqp.state != IBV_QPS_ERR)
		enter_state(ctx, qp, IBV_QPS_ERR);
}

SV_EXPORT int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
			   int mask, struct ibv_qp_init_attr *init)
{
	struct sv_context *ctx = to_sctx(ibqp->context);
	struct sv_qp *qp = to_sqp(ibqp);

	(void)mask;		/* everything is always returned */
	pthread_mutex_lock(&ctx->lock);
	*attr = qp->attr;
	attr->qp_state = qp->ibqp.state;
	attr->cur_qp_state = qp->ibqp.state;
	attr->cap = qp->cap;
	attr->sq_draining = 0;
	memset(init, 0, sizeof(*init));
	init->qp_context = ibqp->qp_context;
	init->send_cq = ibqp->send_cq;
	init->recv_cq = ibqp->recv_cq;
	init->srq = ibqp->srq;
	init->cap = qp->cap;
	init->qp_type = ibqp->qp_type;
	init->sq_sig_all = qp->sq_sig_all;
	pthread_mutex_unlock(&ctx->lock);
	return 0;
}

SV_EXPORT int ibv_destroy_qp(struct ibv_qp *ibqp)
{
	struct sv_context *ctx = to_sctx(ibqp->context);
	struct sv_qp *qp = to_sqp(ibqp), **pp;
	uint32_t reported;

	pthread_mutex_lock(&ctx->lock);
	for (pp = &ctx->qps; *pp; pp = &(*pp)->next) {
		if (*pp == qp) {
			*pp = qp->next;
			ctx->nqps--;
			break;
		}
	}
	sv_qp_ack_flush(ctx, qp);
	sv_qp_unbind(ctx, qp);
	cq_clean(to_scq(ibqp->send_cq), ibqp->qp_num);
	if (ibqp->recv_cq != ibqp->send_cq)
		cq_clean(to_scq(ibqp->recv_cq), ibqp->qp_num);
	async_forget(ctx, qp);
	reported = qp->events_reported;
	pthread_mutex_unlock(&ctx->lock);
	async_wait_acked(&ibqp->mutex, &ibqp->cond,
			 &ibqp->events_completed, reported);
	free(qp->rq.wqe);
	free(qp->sq);
	free(qp);
	return 0;
}

SV_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	/* No QP is created with the new-style send API (IBV_QP_INIT_ATTR_
	 * SEND_OPS_FLAGS is refused), so there is never an extended QP. */
	(void)qp;
	return NULL;
}

/* ---- AH ---- */

SV_EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd,
				       struct ibv_ah_attr *attr)
{
	struct sv_ah *ah;
	int err = check_ah_attr(attr);

	if (err) {
		errno = err;
		return NULL;
	}
	ah = calloc(1, sizeof(*ah));
	if (!ah) {
		errno = ENOMEM;
		return NULL;
	}
	ah->ibah.context = pd->context;
	ah->ibah.pd = pd;
	ah->attr = *attr;
	return &ah->ibah;
}

SV_EXPORT int ibv_destroy_ah(struct ibv_ah *ah)
{
	free(ah);
	return 0;
}

SV_EXPORT int ibv_init_ah_from_wc(struct ibv_context *ibctx, uint8_t port_num,
				  struct ibv_wc *wc, struct ibv_grh *grh,
				  struct ibv_ah_attr *ah)
{
	union ibv_gid mine;

	memset(ah, 0, sizeof(*ah));
	ah->dlid = wc->slid;
	ah->sl = wc->sl;
	ah->src_path_bits = wc->dlid_path_bits;
	ah->port_num = port_num;
	if (!(wc->wc_flags & IBV_WC_GRH))
		return 0;
	/* reply to the sender's GID from the GID the packet was sent to */
	if (ibv_query_gid(ibctx, port_num, 0, &mine))
		return -1;
	if (memcmp(&mine, &grh->dgid, sizeof(mine))) {
		errno = ENOENT;
		return -1;
	}
	ah->is_global = 1;
	ah->grh.dgid = grh->sgid;
	ah->grh.flow_label = be32toh(grh->version_tclass_flow) & 0xfffff;
	ah->grh.sgid_index = 0;
	ah->grh.hop_limit = 0xff;
	ah->grh.traffic_class = (be32toh(grh->version_tclass_flow) >> 20) & 0xff;
	return 0;
}

SV_EXPORT struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd,
					       struct ibv_wc *wc,
					       struct ibv_grh *grh,
					       uint8_t port_num)
{
	struct ibv_ah_attr attr;

	if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr))
		return NULL;
	return ibv_create_ah(pd, &attr);
}
