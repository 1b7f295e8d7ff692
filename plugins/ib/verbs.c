/*
 * The exported verbs calls (the control path): each creates, changes or
 * destroys a real object and keeps the virtual one the application holds
 * and the record the rebuild needs.  Objects are created with the virtual
 * object as their context pointer, so events name the virtual objects.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ib.h"

pthread_mutex_t ib_objects_lock = PTHREAD_MUTEX_INITIALIZER;
struct ib_ctx *ib_contexts;

#define ctx_of(c) ((struct ib_ctx *)(c))
#define pd_of(p) ((struct ib_pd *)(p))
#define cq_of(c) ((struct ib_cq *)(c))
#define qp_of(q) ((struct ib_qp *)(q))
#define srq_of(s) ((struct ib_srq *)(s))
#define ch_of(c) ((struct ib_channel *)(c))
#define ctx_from(obj) ctx_of((obj)->context)

#define LINK(head, obj) do { (obj)->next = (head); (head) = (obj); } while (0)
#define UNLINK(type, head, obj) do {				\
	for (type **pp = &(head); *pp; pp = &(*pp)->next)	\
		if (*pp == (obj)) { *pp = (obj)->next; break; }	\
} while (0)

static int ready(void)
{
	if (ib_real_load()) {
		errno = ENOSYS;
		return 0;
	}
	return 1;
}

/* A second fd for the same file: the application's number stays when the
 * real object behind it is replaced (dup2 at the rebuild). */
static int stable_fd(int real_fd)
{
	return real_fd < 0 ? -1 : fcntl(real_fd, F_DUPFD_CLOEXEC, 0);
}

/* A context of the application's (ours), or one of the real library's:
 * the library calls some exported functions itself (ibv_reg_mr calls
 * ibv_reg_mr_iova2), and those calls reach us too. */
static int is_virtual(const struct ibv_context *context)
{
	return context->ops.post_send == ib_post_send;
}

IB_EXPORT struct ibv_device **ibv_get_device_list(int *num)
{
	if (!ready())
		return NULL;
	return ib_real.get_device_list(num);
}

/* Kept: the application's ibv_context.device points into it, and the real
 * library frees devices with their last context (released at checkpoints). */
IB_EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	(void)list;
}

static int query_lids(struct ib_ctx *ctx, int first)
{
	struct ibv_device_attr dev;
	int err = ib_real.query_device(ctx->real, &dev);

	if (err)
		return err;
	ctx->nports = dev.phys_port_cnt > IB_MAX_PORTS ? IB_MAX_PORTS : dev.phys_port_cnt;
	for (uint8_t p = 1; p <= ctx->nports; p++) {
		struct ibv_port_attr attr;

		memset(&attr, 0, sizeof(attr));
		err = ib_real.query_port(ctx->real, p, &attr);
		if (err)
			return err;
		ctx->lid[p] = attr.lid;
		if (ib_real.query_gid(ctx->real, p, 0, &ctx->gid[p]))
			memset(&ctx->gid[p], 0, sizeof(ctx->gid[p]));
		if (first) {
			ctx->vlid[p] = attr.lid;
			ctx->vgid[p] = ctx->gid[p];
		}
	}
	return 0;
}

IB_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	IB_CONTROL_CALL;
	struct ib_ctx *ctx;

	if (!ready())
		return NULL;
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return NULL;
	ctx->real = ib_real.open_device(device);
	if (!ctx->real) {
		free(ctx);
		return NULL;
	}
	strncpy(ctx->dev_name, ib_real.get_device_name(device), sizeof(ctx->dev_name) - 1);
	if (query_lids(ctx, 1)) {
		ib_real.close_device(ctx->real);
		free(ctx);
		errno = EIO;
		return NULL;
	}
	ctx->ibv.device = device;
	ib_waited_init(&ctx->waited);
	ctx->ibv.cmd_fd = stable_fd(ctx->real->cmd_fd);
	ctx->ibv.async_fd = stable_fd(ctx->real->async_fd);
	ctx->ibv.num_comp_vectors = ctx->real->num_comp_vectors;
	pthread_mutex_init(&ctx->ibv.mutex, NULL);
	ib_ctx_init_ops(ctx);
	ib_ids_epoch_from_job();
	ib_agent_start();
	pthread_mutex_lock(&ib_objects_lock);
	LINK(ib_contexts, ctx);
	pthread_mutex_unlock(&ib_objects_lock);
	return &ctx->ibv;
}

IB_EXPORT int ibv_close_device(struct ibv_context *context)
{
	IB_CONTROL_CALL;
	struct ib_ctx *ctx = ctx_of(context);
	int err;

	ib_enter();
	err = ib_real.close_device(ctx->real);
	ib_leave();
	if (err)
		return err;
	pthread_mutex_lock(&ib_objects_lock);
	UNLINK(struct ib_ctx, ib_contexts, ctx);
	pthread_mutex_unlock(&ib_objects_lock);
	if (ctx->ibv.async_fd >= 0)
		close(ctx->ibv.async_fd);
	if (ctx->ibv.cmd_fd >= 0)
		close(ctx->ibv.cmd_fd);
	free(ctx);
	return 0;
}

IB_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	return ready() ? ib_real.get_device_name(device) : NULL;
}

IB_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr)
{
	IB_CONTROL_CALL;
	int err;

	if (!is_virtual(context))
		return ib_real.query_device(context, attr);
	ib_enter();
	err = ib_real.query_device(ctx_of(context)->real, attr);
	ib_leave();
	return err;
}

/* The compat struct is the whole ibv_port_attr in every binary since 1.1. */
IB_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port,
			     struct _compat_ibv_port_attr *out)
{
	IB_CONTROL_CALL;
	struct ib_ctx *ctx = ctx_of(context);
	struct ibv_port_attr attr;
	int err;

	if (!is_virtual(context))
		return ib_real.query_port(context, port, (struct ibv_port_attr *)out);
	memset(&attr, 0, sizeof(attr));
	ib_enter();
	err = ib_real.query_port(ctx->real, port, &attr);
	ib_leave();
	if (err)
		return err;
	if (port >= 1 && port <= ctx->nports)
		attr.lid = ctx->vlid[port];
	memcpy(out, &attr, sizeof(attr));	/* as the real library does */
	return 0;
}

IB_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port, int index,
			    union ibv_gid *gid)
{
	IB_CONTROL_CALL;
	struct ib_ctx *ctx = ctx_of(context);
	int err;

	if (!is_virtual(context))
		return ib_real.query_gid(context, port, index, gid);
	if (index == 0 && port >= 1 && port <= ctx->nports) {
		*gid = ctx->vgid[port];	/* the one the application knows */
		return 0;
	}
	ib_enter();
	err = ib_real.query_gid(ctx->real, port, index, gid);
	ib_leave();
	return err;
}

IB_EXPORT int ibv_query_pkey(struct ibv_context *context, uint8_t port, int index,
			     __be16 *pkey)
{
	IB_CONTROL_CALL;
	int err;

	if (!is_virtual(context))
		return ib_real.query_pkey(context, port, index, pkey);
	ib_enter();
	err = ib_real.query_pkey(ctx_of(context)->real, port, index, pkey);
	ib_leave();
	return err;
}

IB_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	IB_CONTROL_CALL;
	struct ib_ctx *ctx = ctx_of(context);
	struct ib_pd *pd = calloc(1, sizeof(*pd));

	if (!pd)
		return NULL;
	ib_enter();
	pd->real = ib_real.alloc_pd(ctx->real);
	ib_leave();
	if (!pd->real) {
		free(pd);
		return NULL;
	}
	pd->ibv.context = context;
	pd->ibv.handle = pd->real->handle;
	pthread_mutex_lock(&ib_objects_lock);
	LINK(ctx->pds, pd);
	pthread_mutex_unlock(&ib_objects_lock);
	return &pd->ibv;
}

IB_EXPORT int ibv_dealloc_pd(struct ibv_pd *vpd)
{
	IB_CONTROL_CALL;
	struct ib_pd *pd = pd_of(vpd);
	int err;

	ib_enter();
	err = ib_real.dealloc_pd(pd->real);
	ib_leave();
	if (err)
		return err;
	pthread_mutex_lock(&ib_objects_lock);
	UNLINK(struct ib_pd, ctx_from(vpd)->pds, pd);
	pthread_mutex_unlock(&ib_objects_lock);
	free(pd);
	return 0;
}

/* A virtual key no MR of this process has: the real one if it is free. */
static uint32_t free_virtual_key(uint32_t key)
{
	uint64_t v;

	while (ib_idmap_get(&ib_ids.lkeys, (uint64_t)key + 1, &v) && v) {
		key = key * 2654435761u + 1;
		atomic_store(&ib_ids.lkeys_moved, 1);	/* translate from now on */
	}
	return key;
}

IB_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *vpd, void *addr, size_t length, int access)
{
	IB_CONTROL_CALL;
	struct ib_pd *pd = pd_of(vpd);
	struct ib_mr *mr = calloc(1, sizeof(*mr));
	struct ib_kv_batch batch = { .len = 0 };

	if (!mr)
		return NULL;
	ib_enter();
	mr->real = ib_real.reg_mr(pd->real, addr, length, access);
	ib_leave();
	if (!mr->real) {
		free(mr);
		return NULL;
	}
	mr->pd = pd;
	mr->access = access;
	mr->ibv = *mr->real;
	mr->ibv.context = vpd->context;
	mr->ibv.pd = vpd;
	pthread_mutex_lock(&ib_objects_lock);
	mr->ibv.lkey = free_virtual_key(mr->real->lkey);
	ib_idmap_put(&ib_ids.lkeys, (uint64_t)mr->ibv.lkey + 1, mr->real->lkey);
	LINK(ctx_from(vpd)->mrs, mr);
	pthread_mutex_unlock(&ib_objects_lock);
	if (atomic_load(&ib_ids.remap)) {
		ib_publish_mr(mr, &batch);
		ib_kv_batch_flush(&batch);
	}
	return &mr->ibv;
}

/* verbs.h's ibv_reg_mr() comes here when the access flags are not a
 * constant.  An MR whose I/O address is not its address is not offered. */
IB_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
					  uint64_t iova, unsigned int access)
{
	IB_CONTROL_CALL;
	if (!ready())
		return NULL;
	if (!is_virtual(pd->context)) {
		if (!ib_real.reg_mr_iova2) {
			errno = ENOSYS;
			return NULL;
		}
		return ib_real.reg_mr_iova2(pd, addr, length, iova, access);
	}
	if (iova != (uintptr_t)addr) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	return ibv_reg_mr(pd, addr, length, (int)access);
}

IB_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length,
					 uint64_t iova, int access)
{
	IB_CONTROL_CALL;
	return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned int)access);
}

/* Not offered: the record of the MR would no longer match. */
IB_EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr,
			   size_t length, int access)
{
	IB_CONTROL_CALL;
	if (ready() && !is_virtual(mr->context) && ib_real.rereg_mr)
		return ib_real.rereg_mr(mr, flags, pd, addr, length, access);
	errno = EOPNOTSUPP;
	return IBV_REREG_MR_ERR_INPUT;
}

IB_EXPORT int ibv_dereg_mr(struct ibv_mr *vmr)
{
	IB_CONTROL_CALL;
	struct ib_mr *mr = (struct ib_mr *)vmr;
	int err;

	ib_enter();
	err = ib_real.dereg_mr(mr->real);
	ib_leave();
	if (err)
		return err;
	pthread_mutex_lock(&ib_objects_lock);
	ib_idmap_put(&ib_ids.lkeys, (uint64_t)mr->ibv.lkey + 1, 0);
	UNLINK(struct ib_mr, ctx_from(vmr)->mrs, mr);
	pthread_mutex_unlock(&ib_objects_lock);
	free(mr);
	return 0;
}

IB_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	IB_CONTROL_CALL;
	struct ib_ctx *ctx = ctx_of(context);
	struct ib_channel *ch = calloc(1, sizeof(*ch));

	if (!ch)
		return NULL;
	ib_enter();
	ch->real = ib_real.create_comp_channel(ctx->real);
	ib_leave();
	if (!ch->real) {
		free(ch);
		return NULL;
	}
	ch->ibv.context = context;
	ib_waited_init(&ch->waited);
	ch->ibv.fd = stable_fd(ch->real->fd);
	pthread_mutex_lock(&ib_objects_lock);
	LINK(ctx->channels, ch);
	pthread_mutex_unlock(&ib_objects_lock);
	return &ch->ibv;
}

IB_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *vch)
{
	IB_CONTROL_CALL;
	struct ib_channel *ch = ch_of(vch);
	int err;

	ib_enter();
	err = ib_real.destroy_comp_channel(ch->real);
	ib_leave();
	if (err)
		return err;
	pthread_mutex_lock(&ib_objects_lock);
	UNLINK(struct ib_channel, ctx_from(vch)->channels, ch);
	pthread_mutex_unlock(&ib_objects_lock);
	close(ch->ibv.fd);
	free(ch);
	return 0;
}

/* A destroy waits until the application acked every event of the object
 * that it was handed (see ibv_get_async_event, ibv_get_cq_event), as
 * libibverbs' does. */
static void wait_acked(pthread_mutex_t *mutex, pthread_cond_t *cond,
		       const uint32_t *acked, const uint32_t *handed)
{
	pthread_mutex_lock(mutex);
	while (*acked != *handed)
		pthread_cond_wait(cond, mutex);
	pthread_mutex_unlock(mutex);
}

IB_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
				       struct ibv_comp_channel *vch, int comp_vector)
{
	IB_CONTROL_CALL;
	struct ib_ctx *ctx = ctx_of(context);
	struct ib_cq *cq = calloc(1, sizeof(*cq));

	if (!cq)
		return NULL;
	ib_enter();
	cq->real = ib_real.create_cq(ctx->real, cqe, cq, vch ? ch_of(vch)->real : NULL,
				     comp_vector);
	ib_leave();
	if (!cq->real) {
		free(cq);
		return NULL;
	}
	cq->channel = vch ? ch_of(vch) : NULL;
	cq->comp_vector = comp_vector;
	cq->ibv.context = context;
	cq->ibv.channel = vch;
	cq->ibv.cq_context = cq_context;
	cq->ibv.handle = cq->real->handle;
	cq->ibv.cqe = cq->real->cqe;
	pthread_mutex_init(&cq->ibv.mutex, NULL);
	pthread_cond_init(&cq->ibv.cond, NULL);
	pthread_mutex_lock(&ib_objects_lock);
	LINK(ctx->cqs, cq);
	pthread_mutex_unlock(&ib_objects_lock);
	return &cq->ibv;
}

IB_EXPORT int ibv_resize_cq(struct ibv_cq *vcq, int cqe)
{
	IB_CONTROL_CALL;
	struct ib_cq *cq = cq_of(vcq);
	int err;

	ib_enter();
	err = ib_real.resize_cq(cq->real, cqe);
	ib_leave();
	if (!err)
		cq->ibv.cqe = cq->real->cqe;
	return err;
}

/* Destroys the real CQ and forgets ours, which the caller frees. */
static int destroy_real_cq(struct ibv_cq *vcq)
{
	IB_CONTROL_CALL;
	struct ib_cq *cq = cq_of(vcq);
	int err;

	ib_enter();
	err = ib_real.destroy_cq(cq->real);
	ib_leave();
	if (err)
		return err;
	pthread_mutex_lock(&ib_objects_lock);
	UNLINK(struct ib_cq, ctx_from(vcq)->cqs, cq);
	if (cq->channel)	/* an event it owed is owed no more */
		ib_channel_settle_fd(ctx_from(vcq), cq->channel);
	pthread_mutex_unlock(&ib_objects_lock);
	return 0;
}

/* Once the real object is gone every event of it that was read has been
 * counted (ibv_get_async_event and ibv_get_cq_event count before they ack
 * the real one; a real destroy waits for those acks); the
 * wait for the application's acks is outside the control lock: the ack that
 * ends it takes no lock, and a checkpoint must not wait for the application. */
IB_EXPORT int ibv_destroy_cq(struct ibv_cq *vcq)
{
	struct ib_cq *cq = cq_of(vcq);
	int err = destroy_real_cq(vcq);

	if (err)
		return err;
	wait_acked(&vcq->mutex, &vcq->cond, &vcq->async_events_completed, &cq->async_handed);
	wait_acked(&vcq->mutex, &vcq->cond, &cq->events_acked, &cq->events_handed);
	free(cq->pending);
	free(cq);
	return 0;
}

/* A completion event goes to the application: ibv_destroy_cq waits for
 * its ack. */
static void count_handed(struct ib_cq *cq)
{
	pthread_mutex_lock(&cq->ibv.mutex);
	cq->events_handed++;
	pthread_mutex_unlock(&cq->ibv.mutex);
}

/* A CQ of this channel owed an event the release took from the device
 * (app_fds.c): the caller hands it out, counted while the CQ is in the
 * list (a destroy that unlinks it after this waits for its ack).  Once
 * none is owed, the channel's number names the real channel again. */
static struct ib_cq *take_owed_event(struct ib_channel *ch)
{
	struct ib_ctx *ctx = ctx_from(&ch->ibv);
	struct ib_cq *found = NULL;

	pthread_mutex_lock(&ib_objects_lock);
	for (struct ib_cq *cq = ctx->cqs; cq && !found; cq = cq->next)
		if (cq->channel == ch && cq->event_owed)
			found = cq;
	if (found) {
		found->event_owed = 0;
		count_handed(found);
	}
	ib_channel_settle_fd(ctx, ch);
	pthread_mutex_unlock(&ib_objects_lock);
	return found;
}

static int deliver(struct ib_cq *cq, struct ibv_cq **out, void **context)
{
	cq->armed = 0;
	*out = &cq->ibv;
	*context = cq->ibv.cq_context;
	return 0;
}

/*
 * Blocks in the real library, so it does not hold the gate.  A checkpoint
 * releases the real channel under a thread waiting here: the real fd then
 * reads end-of-file (its number is held by /dev/null until the rebuild),
 * the real call fails, and the thread waits for the rebuild and
 * tries again on the new channel.
 */
IB_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *vch, struct ibv_cq **out, void **context)
{
	struct ib_channel *ch = ch_of(vch);

	for (;;) {
		struct ib_cq *cq;
		struct ibv_cq *real;
		void *vcq;
		unsigned gen;
		int err;

		ib_gate_wait();
		if (ib_wait_enter(&ch->waited, &gen))
			continue;
		/* after the wait too: a release meanwhile may have taken an
		 * event from the device */
		cq = take_owed_event(ch);
		if (cq) {
			ib_wait_leave(&ch->waited, gen);
			return deliver(cq, out, context);
		}
		err = ib_real.get_cq_event(ch->real, &real, &vcq);
		if (!err) {
			/* acked at once, taking no lock: a release destroying
			 * the real CQ meanwhile waits for this ack */
			count_handed(vcq);
			ib_real.ack_cq_events(real, 1);
		}
		ib_wait_leave(&ch->waited, gen);
		if (!err)
			return deliver(vcq, out, context);
		if (atomic_load(&ib_releases) == gen && !atomic_load(&ib_gate_closed))
			return -1;	/* a real failure, not a checkpoint */
	}
}

/* Takes no control lock: a destroy may be waiting for this ack, and the
 * real events were acked as they were read. */
IB_EXPORT void ibv_ack_cq_events(struct ibv_cq *vcq, unsigned int n)
{
	struct ib_cq *cq = cq_of(vcq);

	pthread_mutex_lock(&vcq->mutex);
	cq->events_acked += n;
	pthread_cond_broadcast(&vcq->cond);
	pthread_mutex_unlock(&vcq->mutex);
}

IB_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *vpd, struct ibv_srq_init_attr *attr)
{
	IB_CONTROL_CALL;
	struct ib_pd *pd = pd_of(vpd);
	struct ib_srq *srq = calloc(1, sizeof(*srq));
	struct ibv_srq_init_attr real_attr = *attr;

	if (!srq)
		return NULL;
	real_attr.srq_context = srq;
	ib_enter();
	srq->real = ib_real.create_srq(pd->real, &real_attr);
	ib_leave();
	if (!srq->real || ib_recv_log_init(&srq->posted, real_attr.attr.max_wr)) {
		if (srq->real)
			ib_real.destroy_srq(srq->real);
		free(srq);
		return NULL;
	}
	attr->attr = real_attr.attr;	/* what the device gave */
	srq->attr = *attr;
	srq->pd = pd;
	pthread_mutex_init(&srq->post_lock, NULL);
	srq->ibv.context = vpd->context;
	srq->ibv.srq_context = attr->srq_context;
	srq->ibv.pd = vpd;
	srq->ibv.handle = srq->real->handle;
	pthread_mutex_init(&srq->ibv.mutex, NULL);
	pthread_cond_init(&srq->ibv.cond, NULL);
	pthread_mutex_lock(&ib_objects_lock);
	LINK(ctx_from(vpd)->srqs, srq);
	pthread_mutex_unlock(&ib_objects_lock);
	return &srq->ibv;
}

IB_EXPORT int ibv_modify_srq(struct ibv_srq *vsrq, struct ibv_srq_attr *attr, int mask)
{
	IB_CONTROL_CALL;
	struct ib_srq *srq = srq_of(vsrq);
	int err;

	ib_enter();
	err = ib_real.modify_srq(srq->real, attr, mask);
	ib_leave();
	if (!err && (mask & IBV_SRQ_LIMIT))
		srq->attr.attr.srq_limit = attr->srq_limit;
	return err;
}

IB_EXPORT int ibv_query_srq(struct ibv_srq *vsrq, struct ibv_srq_attr *attr)
{
	IB_CONTROL_CALL;
	int err;

	ib_enter();
	err = ib_real.query_srq(srq_of(vsrq)->real, attr);
	ib_leave();
	return err;
}

/* Destroys the real SRQ and forgets ours, which the caller frees. */
static int destroy_real_srq(struct ibv_srq *vsrq)
{
	IB_CONTROL_CALL;
	struct ib_srq *srq = srq_of(vsrq);
	int err;

	ib_enter();
	err = ib_real.destroy_srq(srq->real);
	ib_leave();
	if (err)
		return err;
	pthread_mutex_lock(&ib_objects_lock);
	UNLINK(struct ib_srq, ctx_from(vsrq)->srqs, srq);
	pthread_mutex_unlock(&ib_objects_lock);
	return 0;
}

/* Waits for the application's acks as ibv_destroy_cq does. */
IB_EXPORT int ibv_destroy_srq(struct ibv_srq *vsrq)
{
	struct ib_srq *srq = srq_of(vsrq);
	int err = destroy_real_srq(vsrq);

	if (err)
		return err;
	wait_acked(&vsrq->mutex, &vsrq->cond, &vsrq->events_completed,
			 &srq->async_handed);
	free(srq->posted.ring);
	free(srq);
	return 0;
}

/* The creation attributes with the real CQs and SRQ in place. */
void ib_qp_real_init(const struct ib_qp *qp, struct ibv_qp_init_attr *real)
{
	*real = qp->init;
	real->qp_context = (void *)qp;
	real->send_cq = qp->init.send_cq ? cq_of(qp->init.send_cq)->real : NULL;
	real->recv_cq = qp->init.recv_cq ? cq_of(qp->init.recv_cq)->real : NULL;
	real->srq = qp->init.srq ? srq_of(qp->init.srq)->real : NULL;
}

IB_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *vpd, struct ibv_qp_init_attr *attr)
{
	IB_CONTROL_CALL;
	struct ib_pd *pd = pd_of(vpd);
	struct ib_qp *qp = calloc(1, sizeof(*qp));
	struct ibv_qp_init_attr real_attr;
	struct ib_kv_batch batch = { .len = 0 };

	if (!qp)
		return NULL;
	qp->init = *attr;
	ib_qp_real_init(qp, &real_attr);
	ib_enter();
	qp->real = ib_real.create_qp(pd->real, &real_attr);
	ib_leave();
	if (!qp->real) {
		free(qp);
		return NULL;
	}
	attr->cap = real_attr.cap;	/* what the device gave */
	qp->init.cap = real_attr.cap;
	if (!attr->srq && ib_recv_log_init(&qp->posted, real_attr.cap.max_recv_wr)) {
		ib_real.destroy_qp(qp->real);
		free(qp);
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_init(&qp->rkeys.lock, NULL);
	qp->pd = pd;
	qp->ibv.context = vpd->context;
	qp->ibv.qp_context = attr->qp_context;
	qp->ibv.pd = vpd;
	qp->ibv.send_cq = attr->send_cq;
	qp->ibv.recv_cq = attr->recv_cq;
	qp->ibv.srq = attr->srq;
	qp->ibv.handle = qp->real->handle;
	qp->ibv.state = IBV_QPS_RESET;
	qp->ibv.qp_type = attr->qp_type;
	pthread_mutex_init(&qp->ibv.mutex, NULL);
	pthread_cond_init(&qp->ibv.cond, NULL);
	/* until the job's first rebuild, virtual and real numbers are one */
	qp->ibv.qp_num = atomic_load(&ib_ids.remap) ? ib_claim_qpn(qp->real->qp_num) :
		(ib_claim_qpn(qp->real->qp_num), qp->real->qp_num);
	pthread_mutex_lock(&ib_objects_lock);
	ib_idmap_put(&ib_ids.qp_by_real, (uint64_t)qp->real->qp_num + 1, (uint64_t)qp);
	LINK(ctx_from(vpd)->qps, qp);
	pthread_mutex_unlock(&ib_objects_lock);
	if (atomic_load(&ib_ids.remap)) {
		ib_publish_qp(ctx_from(vpd), qp, &batch);
		ib_kv_batch_flush(&batch);
	}
	return &qp->ibv;
}

struct ib_qp *ib_qp_of_real(uint32_t real_qpn)
{
	uint64_t v;

	return ib_idmap_get(&ib_ids.qp_by_real, (uint64_t)real_qpn + 1, &v) ?
		(struct ib_qp *)v : NULL;
}

/* The peer of a connected QP: its owner names its rkeys. */
void ib_qp_resolve_peer(struct ib_qp *qp, uint32_t dest_vqpn)
{
	char key[64], value[128];
	unsigned lid, qpn;
	int used = 0;

	qp->peer_owner[0] = '\0';
	ib_idmap_clear(&qp->rkeys);
	if (!atomic_load(&ib_ids.remap))
		return;
	snprintf(key, sizeof(key), "ib:%u:qp:%u", ib_ids.epoch, dest_vqpn);
	if (ib_kv_get(key, value, sizeof(value)) == 0 &&
	    sscanf(value, "%u.%u.%n", &lid, &qpn, &used) == 2 && used)
		snprintf(qp->peer_owner, sizeof(qp->peer_owner), "%s", value + used);
}

/* attr with the real ids the device must see. */
void ib_real_qp_attr(struct ibv_qp_attr *attr, int mask)
{
	if (mask & IBV_QP_AV)
		ib_real_ah_attr(&attr->ah_attr);
	if (mask & IBV_QP_ALT_PATH)
		ib_real_ah_attr(&attr->alt_ah_attr);
	if (mask & IBV_QP_DEST_QPN)
		attr->dest_qp_num = ib_real_qpn(attr->dest_qp_num);
}

IB_EXPORT int ibv_modify_qp(struct ibv_qp *vqp, struct ibv_qp_attr *attr, int mask)
{
	IB_CONTROL_CALL;
	struct ib_qp *qp = qp_of(vqp);
	struct ibv_qp_attr real = *attr;
	int err;

	ib_real_qp_attr(&real, mask);
	ib_enter();
	err = ib_real.modify_qp(qp->real, &real, mask);
	ib_leave();
	if (err)
		return err;
	ib_history_record(qp, attr, mask);
	if (mask & IBV_QP_DEST_QPN)
		ib_qp_resolve_peer(qp, attr->dest_qp_num);
	return 0;
}

IB_EXPORT int ibv_query_qp(struct ibv_qp *vqp, struct ibv_qp_attr *attr, int mask,
			   struct ibv_qp_init_attr *init)
{
	IB_CONTROL_CALL;
	struct ib_qp *qp = qp_of(vqp);
	const struct ibv_qp_attr *set;
	int err;

	ib_enter();
	err = ib_real.query_qp(qp->real, attr, mask, init);
	ib_leave();
	if (err)
		return err;
	if ((set = ib_history_last(qp, IBV_QP_AV)))
		attr->ah_attr = set->ah_attr;
	if ((set = ib_history_last(qp, IBV_QP_ALT_PATH)))
		attr->alt_ah_attr = set->alt_ah_attr;
	if ((set = ib_history_last(qp, IBV_QP_DEST_QPN)))
		attr->dest_qp_num = set->dest_qp_num;
	if (init) {
		struct ibv_qp_cap cap = init->cap;

		*init = qp->init;
		init->cap = cap;
	}
	return 0;
}

/* Destroys the real QP and forgets ours, which the caller frees. */
static int destroy_real_qp(struct ibv_qp *vqp)
{
	IB_CONTROL_CALL;
	struct ib_qp *qp = qp_of(vqp);
	uint32_t real_qpn = qp->real->qp_num;
	int err;

	ib_enter();
	err = ib_real.destroy_qp(qp->real);
	ib_leave();
	if (err)
		return err;
	pthread_mutex_lock(&ib_objects_lock);
	ib_idmap_put(&ib_ids.qp_by_real, (uint64_t)real_qpn + 1, 0);
	UNLINK(struct ib_qp, ctx_from(vqp)->qps, qp);
	pthread_mutex_unlock(&ib_objects_lock);
	return 0;
}

/* Waits for the application's acks as ibv_destroy_cq does. */
IB_EXPORT int ibv_destroy_qp(struct ibv_qp *vqp)
{
	struct ib_qp *qp = qp_of(vqp);
	int err = destroy_real_qp(vqp);

	if (err)
		return err;
	wait_acked(&vqp->mutex, &vqp->cond, &vqp->events_completed,
			 &qp->async_handed);
	free(qp->posted.ring);
	ib_idmap_free(&qp->rkeys);
	free(qp);
	return 0;
}

IB_EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *vpd, struct ibv_ah_attr *attr)
{
	IB_CONTROL_CALL;
	struct ib_pd *pd = pd_of(vpd);
	struct ib_ah *ah;
	struct ibv_ah_attr real = *attr;

	if (!is_virtual(vpd->context))
		return ib_real.create_ah(vpd, attr);
	ah = calloc(1, sizeof(*ah));
	if (!ah)
		return NULL;
	ib_real_ah_attr(&real);
	ib_enter();
	ah->real = ib_real.create_ah(pd->real, &real);
	ib_leave();
	if (!ah->real) {
		free(ah);
		return NULL;
	}
	ah->pd = pd;
	ah->attr = *attr;
	ah->ibv.context = vpd->context;
	ah->ibv.pd = vpd;
	ah->ibv.handle = ah->real->handle;
	pthread_mutex_lock(&ib_objects_lock);
	LINK(ctx_from(vpd)->ahs, ah);
	pthread_mutex_unlock(&ib_objects_lock);
	return &ah->ibv;
}

IB_EXPORT int ibv_destroy_ah(struct ibv_ah *vah)
{
	IB_CONTROL_CALL;
	struct ib_ah *ah = (struct ib_ah *)vah;
	int err;

	ib_enter();
	err = ib_real.destroy_ah(ah->real);
	ib_leave();
	if (err)
		return err;
	pthread_mutex_lock(&ib_objects_lock);
	UNLINK(struct ib_ah, ctx_from(vah)->ahs, ah);
	pthread_mutex_unlock(&ib_objects_lock);
	free(ah);
	return 0;
}

/* The work completion holds virtual ids already: the attributes made from
 * it are virtual too, as ibv_create_ah() expects. */
IB_EXPORT int ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port, struct ibv_wc *wc,
				  struct ibv_grh *grh, struct ibv_ah_attr *attr)
{
	IB_CONTROL_CALL;
	int err;

	ib_enter();
	err = ib_real.init_ah_from_wc(ctx_of(context)->real, port, wc, grh, attr);
	ib_leave();
	return err;
}

IB_EXPORT struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc,
					       struct ibv_grh *grh, uint8_t port)
{
	IB_CONTROL_CALL;
	struct ibv_ah_attr attr;

	if (ibv_init_ah_from_wc(pd->context, port, wc, grh, &attr))
		return NULL;
	return ibv_create_ah(pd, &attr);
}

/*
 * Async events keep libibverbs' promise to the application, that an object
 * is destroyed only once every event naming it was acked, on our objects:
 * the real event is acked as soon as it is read, so a release at a
 * checkpoint never waits for an application thread, and our destroy waits
 * for the application's acks instead (wait_acked).
 */
struct async_counts {
	pthread_mutex_t *mutex;
	pthread_cond_t *cond;
	uint32_t *acked, *handed;
};

static bool async_counts_of(const struct ibv_async_event *event, struct async_counts *k)
{
	switch (event->event_type) {
	case IBV_EVENT_CQ_ERR: {
		struct ib_cq *cq = cq_of(event->element.cq);

		*k = (struct async_counts){ &cq->ibv.mutex, &cq->ibv.cond,
			&cq->ibv.async_events_completed, &cq->async_handed };
		return true;
	}
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED: {
		struct ib_srq *srq = srq_of(event->element.srq);

		*k = (struct async_counts){ &srq->ibv.mutex, &srq->ibv.cond,
			&srq->ibv.events_completed, &srq->async_handed };
		return true;
	}
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED: {
		struct ib_qp *qp = qp_of(event->element.qp);

		*k = (struct async_counts){ &qp->ibv.mutex, &qp->ibv.cond,
			&qp->ibv.events_completed, &qp->async_handed };
		return true;
	}
	default:	/* port and device events name no object */
		return false;
	}
}

static void async_count(uint32_t *counter, const struct async_counts *k)
{
	pthread_mutex_lock(k->mutex);
	++*counter;
	pthread_cond_broadcast(k->cond);
	pthread_mutex_unlock(k->mutex);
}

/* Our object of a real event: the real objects were created with ours as
 * their context. */
static void async_to_virtual(struct ibv_async_event *event)
{
	switch (event->event_type) {
	case IBV_EVENT_CQ_ERR:
		event->element.cq = &((struct ib_cq *)event->element.cq->cq_context)->ibv;
		break;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		event->element.srq = &((struct ib_srq *)event->element.srq->srq_context)->ibv;
		break;
	case IBV_EVENT_DEVICE_FATAL:
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		break;
	default:
		event->element.qp = &((struct ib_qp *)event->element.qp->qp_context)->ibv;
	}
}

/* Blocks in the real library, like ibv_get_cq_event: a checkpoint that
 * releases the device under a waiting thread makes it wait for the rebuild
 * and try again on the new context. */
IB_EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	struct ib_ctx *ctx = ctx_of(context);
	struct async_counts k;

	for (;;) {
		struct ibv_context *real;
		unsigned gen;
		int err;

		ib_gate_wait();
		if (ib_wait_enter(&ctx->waited, &gen))
			continue;
		real = ctx->real;
		err = real ? ib_real.get_async_event(real, event) : -1;
		ib_wait_leave(&ctx->waited, gen);
		if (!err)
			break;
		if (real && atomic_load(&ib_releases) == gen && !atomic_load(&ib_gate_closed))
			return -1;	/* a real failure, not a checkpoint */
	}
	{
		struct ibv_async_event real_event = *event;

		async_to_virtual(event);
		if (async_counts_of(event, &k))
			async_count(k.handed, &k);
		ib_real.ack_async_event(&real_event);
	}
	return 0;
}

/* Takes no control lock: a destroy may be waiting for this ack. */
IB_EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
	struct async_counts k;

	if (async_counts_of(event, &k))
		async_count(k.acked, &k);
}
