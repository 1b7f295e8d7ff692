/*
 * Rebuild every verbs object after a checkpoint, on whatever device the
 * host has now: reopen the device by name, recreate PDs, MRs (same
 * addresses, new keys), channels, CQs, SRQs and QPs (new numbers), publish
 * the new real ids in one batch, look up the peers' ids in one round
 * (MWAIT), replay each QP's state transitions with the peers' new ids,
 * recreate the address handles and re-post the receives that were posted.
 * Runs in the agent with the gate closed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ib.h"

#define PEER_WAIT_S 60

static struct ibv_device *find_device(struct ibv_device **list, const char *name)
{
	for (int i = 0; list && list[i]; i++)
		if (!strcmp(ib_real.get_device_name(list[i]), name))
			return list[i];
	return list ? list[0] : NULL;
}

static int reopen(struct ib_ctx *ctx, struct ibv_device **list)
{
	struct ibv_device *dev = find_device(list, ctx->dev_name);

	if (!dev) {
		ib_log("no verbs device to reopen %s on", ctx->dev_name);
		return ENODEV;
	}
	if (strcmp(ib_real.get_device_name(dev), ctx->dev_name))
		ib_log("device %s is gone: using %s", ctx->dev_name, ib_real.get_device_name(dev));
	ctx->real = ib_real.open_device(dev);
	if (!ctx->real)
		return errno ? errno : ENODEV;
	ib_fd_bind(ctx->ibv.async_fd, ctx->real->async_fd);
	ib_epoll_watchers_restore(ctx->ibv.async_fd, &ctx->async_watchers);
	ib_fd_bind(ctx->ibv.cmd_fd, ctx->real->cmd_fd);
	/* the LIDs the application knows stay; the real ones are new */
	for (uint8_t p = 1; p <= ctx->nports; p++) {
		struct ibv_port_attr attr;

		memset(&attr, 0, sizeof(attr));
		if (ib_real.query_port(ctx->real, p, &attr) == 0)
			ctx->lid[p] = attr.lid;
		if (ib_real.query_gid(ctx->real, p, 0, &ctx->gid[p]))
			memset(&ctx->gid[p], 0, sizeof(ctx->gid[p]));
	}
	return 0;
}

static int recreate_memory(struct ib_ctx *ctx)
{
	for (struct ib_pd *pd = ctx->pds; pd; pd = pd->next) {
		pd->real = ib_real.alloc_pd(ctx->real);
		if (!pd->real)
			return errno ? errno : ENOMEM;
	}
	for (struct ib_mr *mr = ctx->mrs; mr; mr = mr->next) {
		mr->real = ib_real.reg_mr(mr->pd->real, mr->ibv.addr, mr->ibv.length, mr->access);
		if (!mr->real)
			return errno ? errno : ENOMEM;
		ib_idmap_put(&ib_ids.lkeys, (uint64_t)mr->ibv.lkey + 1, mr->real->lkey);
	}
	return 0;
}

static int recreate_queues(struct ib_ctx *ctx)
{
	for (struct ib_channel *ch = ctx->channels; ch; ch = ch->next) {
		ch->real = ib_real.create_comp_channel(ctx->real);
		if (!ch->real)
			return errno ? errno : ENOMEM;
	}
	for (struct ib_cq *cq = ctx->cqs; cq; cq = cq->next) {
		cq->real = ib_real.create_cq(ctx->real, cq->ibv.cqe, cq,
					     cq->channel ? cq->channel->real : NULL, cq->comp_vector);
		if (!cq->real)
			return errno ? errno : ENOMEM;
		if (cq->armed)
			cq->real->context->ops.req_notify_cq(cq->real, cq->solicited_only);
	}
	for (struct ib_channel *ch = ctx->channels; ch; ch = ch->next)
		ib_channel_bind_fd(ctx, ch);
	for (struct ib_srq *srq = ctx->srqs; srq; srq = srq->next) {
		struct ibv_srq_init_attr attr = srq->attr;

		attr.srq_context = srq;
		srq->real = ib_real.create_srq(srq->pd->real, &attr);
		if (!srq->real)
			return errno ? errno : ENOMEM;
	}
	for (struct ib_qp *qp = ctx->qps; qp; qp = qp->next) {
		struct ibv_qp_init_attr attr;

		ib_qp_real_init(qp, &attr);
		qp->real = ib_real.create_qp(qp->pd->real, &attr);
		if (!qp->real)
			return errno ? errno : ENOMEM;
		ib_idmap_put(&ib_ids.qp_by_real, (uint64_t)qp->real->qp_num + 1, (uint64_t)qp);
		ib_debug("epoch %u: QP %#x is now %#x on LID %#x, %u receives posted",
			 ib_ids.epoch, qp->ibv.qp_num, qp->real->qp_num, ctx->lid[1],
			 ib_recv_log_count(&qp->posted));
	}
	return 0;
}

static int publish(void)
{
	struct ib_kv_batch batch = { .len = 0 };
	char epoch[16];

	for (struct ib_ctx *ctx = ib_contexts; ctx; ctx = ctx->next) {
		ib_publish_gids(ctx, &batch);
		for (struct ib_qp *qp = ctx->qps; qp; qp = qp->next)
			ib_publish_qp(ctx, qp, &batch);
		for (struct ib_mr *mr = ctx->mrs; mr; mr = mr->next)
			ib_publish_mr(mr, &batch);
	}
	snprintf(epoch, sizeof(epoch), "%u", ib_ids.epoch);
	ib_kv_batch_put(&batch, "ib:epoch", epoch);
	return ib_kv_batch_flush(&batch);
}

/* Keys of the peers' ids this process needs now, space separated. */
static size_t wanted_keys(char *buf, size_t size)
{
	size_t n = 0;

	buf[0] = '\0';
	for (struct ib_ctx *ctx = ib_contexts; ctx; ctx = ctx->next) {
		for (struct ib_qp *qp = ctx->qps; qp; qp = qp->next)
			for (unsigned i = 0; i < qp->nhistory; i++)
				if ((qp->history[i].mask & IBV_QP_DEST_QPN) && n + 48 < size)
					n += snprintf(buf + n, size - n, " ib:%u:qp:%u", ib_ids.epoch,
						      qp->history[i].attr.dest_qp_num);
	}
	return n;
}

/*
 * The connected peers publish as they rebuild: wait for them all in one
 * request.  A peer that never publishes (not in the job) keeps its ids.
 */
static void wait_for_peers(void)
{
	char keys[3000], request[3100], answer[4096];

	if (!wanted_keys(keys, sizeof(keys)))
		return;
	snprintf(request, sizeof(request), "MWAIT %d%s", PEER_WAIT_S, keys);
	if (ib_kv_request(request, answer, sizeof(answer)) == 0 && !strncmp(answer, "NONE", 4))
		ib_log("no new ids published for%s: kept as they were", answer + 4);
}

static int replay(struct ib_ctx *ctx)
{
	for (struct ib_qp *qp = ctx->qps; qp; qp = qp->next) {
		for (unsigned i = 0; i < qp->nhistory; i++) {
			struct ibv_qp_attr attr = qp->history[i].attr;
			int mask = qp->history[i].mask;

			ib_real_qp_attr(&attr, mask);
			ib_debug("QP %#x: transition to %d, mask %#x, dest %#x, dlid %#x, "
				 "rq_psn %#x, sq_psn %#x", qp->ibv.qp_num, attr.qp_state, mask,
				 attr.dest_qp_num, attr.ah_attr.dlid, attr.rq_psn, attr.sq_psn);
			if (ib_real.modify_qp(qp->real, &attr, mask)) {
				ib_log("QP %u: replaying transition %u: %s", qp->ibv.qp_num, i,
				       strerror(errno));
				return errno ? errno : EINVAL;
			}
			if (mask & IBV_QP_DEST_QPN)
				ib_qp_resolve_peer(qp, qp->history[i].attr.dest_qp_num);
		}
	}
	for (struct ib_ah *ah = ctx->ahs; ah; ah = ah->next) {
		struct ibv_ah_attr attr = ah->attr;

		ib_real_ah_attr(&attr);
		ib_debug("AH to LID %#x is now to %#x", ah->attr.dlid, attr.dlid);
		ah->real = ib_real.create_ah(ah->pd->real, &attr);
		if (!ah->real)
			return errno ? errno : ENOMEM;
	}
	return 0;
}

static int repost(struct ib_ctx *ctx)
{
	for (struct ib_srq *srq = ctx->srqs; srq; srq = srq->next)
		for (unsigned i = 0; i < ib_recv_log_count(&srq->posted); i++)
			if (ib_repost_srq_recv(srq->real, ib_recv_log_at(&srq->posted, i)))
				return EIO;
	for (struct ib_qp *qp = ctx->qps; qp; qp = qp->next) {
		if (qp->init.srq || qp->ibv.state < IBV_QPS_INIT)
			continue;
		for (unsigned i = 0; i < ib_recv_log_count(&qp->posted); i++)
			if (ib_repost_recv(qp->real, ib_recv_log_at(&qp->posted, i)))
				return EIO;
	}
	return 0;
}

int ib_rebuild(long members)
{
	struct ibv_device **list;
	int err = 0;

	ib_idmap_clear(&ib_ids.remote_qpn);
	ib_idmap_clear(&ib_ids.remote_lid);
	ib_idmap_clear(&ib_ids.back);
	pthread_mutex_lock(&ib_ids.gid_lock);
	ib_ids.ngids = 0;
	pthread_mutex_unlock(&ib_ids.gid_lock);
	ib_idmap_clear(&ib_ids.qp_by_real);
	atomic_store(&ib_ids.remap, 1);
	list = ib_real.get_device_list(NULL);
	pthread_mutex_lock(&ib_objects_lock);
	for (struct ib_ctx *ctx = ib_contexts; ctx && !err; ctx = ctx->next) {
		err = reopen(ctx, list);
		if (!err)
			err = recreate_memory(ctx);
		if (!err)
			err = recreate_queues(ctx);
	}
	if (!err)
		err = publish();
	pthread_mutex_unlock(&ib_objects_lock);
	if (err)
		ib_log("rebuilding the verbs objects failed: %s", strerror(err));
	/* every verbs process of the job has published before anyone looks up */
	if (!ib_kv_count_in(ib_ids.epoch, "published", NULL) &&
	    ib_kv_await(ib_ids.epoch, "published", members, PEER_WAIT_S))
		ib_log("not every verbs process rebuilt within %d s", PEER_WAIT_S);
	if (!err) {
		wait_for_peers();
		pthread_mutex_lock(&ib_objects_lock);
		for (struct ib_ctx *ctx = ib_contexts; ctx && !err; ctx = ctx->next) {
			err = replay(ctx);
			if (!err)
				err = repost(ctx);
		}
		pthread_mutex_unlock(&ib_objects_lock);
		if (err)
			ib_log("rebuilding the verbs objects failed: %s", strerror(err));
	}
	/* the released fds' numbers are free again (lifecycle.c) */
	pthread_mutex_lock(&ib_objects_lock);
	for (struct ib_ctx *ctx = ib_contexts; ctx; ctx = ctx->next) {
		ib_waited_rebuilt(&ctx->waited);
		for (struct ib_channel *ch = ctx->channels; ch; ch = ch->next)
			ib_waited_rebuilt(&ch->waited);
	}
	pthread_mutex_unlock(&ib_objects_lock);
	/* nobody sends before every receiver's queues are ready again: a UD
	 * message to a QP not yet in RTR, or with no receive posted, is lost */
	if (!ib_kv_count_in(ib_ids.epoch, "ready", NULL) &&
	    ib_kv_await(ib_ids.epoch, "ready", members, PEER_WAIT_S))
		ib_log("not every verbs process was ready within %d s", PEER_WAIT_S);
	return err;
}
