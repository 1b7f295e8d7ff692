/*
 * The IB plugin's own cost on the data path, without a device's noise:
 * the plugin's post_send, post_recv and poll_cq run over a stub "device" whose
 * calls do nothing (post) or hand back one completion or none (poll), and are compared
 * with calling the stub directly.  Before any checkpoint ids are not
 * translated; after one (remap) every lkey, remote QPN and completion is,
 * through the caches.  Built with the plugin's sources (bench/ib_bench.py).
 * Prints "<case> <plain ns> <plugin ns>" lines.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ib.h"

#define BLOCKS 20
#define PER_BLOCK 500000

static struct ibv_context real_ctx;
static struct ibv_qp real_qp = { .context = &real_ctx, .qp_num = 0x1234, .qp_type = IBV_QPT_UD };
static struct ibv_cq real_cq = { .context = &real_ctx };
static struct ibv_ah real_ah = { .context = &real_ctx };

static int stub_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	__asm__ volatile("" : : "r"(wr) : "memory");
	return 0;
}

static int stub_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	__asm__ volatile("" : : "r"(wr) : "memory");
	return 0;
}

static int cq_empty;	/* an empty poll: what a busy-polling library does most */

static int stub_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	static unsigned flip;

	if (cq_empty)
		return 0;
	memset(wc, 0, sizeof(*wc));
	wc->qp_num = 0x1234;
	wc->opcode = (flip++ & 1) ? IBV_WC_RECV : IBV_WC_SEND;
	wc->slid = 7;
	wc->src_qp = 0x5678;
	return 1;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef void (*op_fn)(void *);

static double best_ns(op_fn fn, void *arg)
{
	double best = 1e30;

	for (int b = 0; b < BLOCKS; b++) {
		double t0 = now();

		for (int i = 0; i < PER_BLOCK; i++)
			fn(arg);
		best = fmin(best, (now() - t0) * 1e9 / PER_BLOCK);
	}
	return best;
}

static struct ib_qp *vqp;
static struct ib_cq *vcq;
static struct ib_ah *vah;
static struct ibv_sge sge = { 0x1000, 8, 0x42 };
static struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };

static void plain_send(void *arg)
{
	struct ibv_send_wr *bad;
	struct ibv_send_wr w = wr;

	w.wr.ud.ah = &real_ah;
	real_ctx.ops.post_send(&real_qp, &w, &bad);
}

static void plugin_send(void *arg)
{
	struct ibv_send_wr *bad;

	vqp->ibv.context->ops.post_send(&vqp->ibv, &wr, &bad);
}

static struct ibv_recv_wr recv_wr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1 };

static void plain_recv(void *arg)
{
	struct ibv_recv_wr *bad;

	real_ctx.ops.post_recv(&real_qp, &recv_wr, &bad);
}

/* with its completion's part (taking it off the log): the log must not fill */
static void plugin_recv(void *arg)
{
	struct ibv_recv_wr *bad;

	vqp->ibv.context->ops.post_recv(&vqp->ibv, &recv_wr, &bad);
	ib_recv_log_pop_front(&vqp->posted);
}

static void plain_poll(void *arg)
{
	struct ibv_wc wc;

	real_ctx.ops.poll_cq(&real_cq, 1, &wc);
}

static void plugin_poll(void *arg)
{
	struct ibv_wc wc;

	vcq->ibv.context->ops.poll_cq(&vcq->ibv, 1, &wc);
	if ((wc.opcode & IBV_WC_RECV) && ib_recv_log_count(&vqp->posted) == 0) {
		struct ibv_recv_wr r = { .wr_id = 9, .sg_list = &sge, .num_sge = 1 };

		ib_recv_log_push(&vqp->posted, &r);	/* keep one receive logged */
	}
}

int main(void)
{
	static struct ib_ctx ctx;
	struct ibv_recv_wr r = { .wr_id = 9, .sg_list = &sge, .num_sge = 1 };

	real_ctx.ops.post_send = stub_post_send;
	real_ctx.ops.poll_cq = stub_poll_cq;
	real_ctx.ops.post_recv = stub_post_recv;
	ib_ctx_init_ops(&ctx);
	vqp = calloc(1, sizeof(*vqp));
	vcq = calloc(1, sizeof(*vcq));
	vah = calloc(1, sizeof(*vah));
	vqp->real = &real_qp;
	vqp->ibv = real_qp;
	vqp->ibv.context = &ctx.ibv;
	vcq->real = &real_cq;
	vcq->ibv.context = &ctx.ibv;
	vah->real = &real_ah;
	wr.wr.ud.ah = &vah->ibv;
	wr.wr.ud.remote_qpn = 0x5678;
	ib_recv_log_init(&vqp->posted, 64);
	ib_recv_log_push(&vqp->posted, &r);
	ib_idmap_put(&ib_ids.qp_by_real, 0x1234 + 1, (uint64_t)vqp);

	cq_empty = 1;
	printf("empty_poll_cq %.1f %.1f\n", best_ns(plain_poll, NULL), best_ns(plugin_poll, NULL));
	cq_empty = 0;
	for (int remap = 0; remap < 2; remap++) {
		const char *when = remap ? "after_a_checkpoint" : "before_any_checkpoint";

		if (remap) {	/* the caches a rebuild and the first uses fill */
			atomic_store(&ib_ids.remap, 1);
			ib_idmap_put(&ib_ids.lkeys, 0x42 + 1, 0x99);
			ib_idmap_put(&ib_ids.remote_qpn, 0x5678 + 1, 0x8765);
			ib_idmap_put(&ib_ids.back, ((uint64_t)7 << 24 | 0x5678) + 1,
				     (uint64_t)3 << 24 | 0x1111);
		}
		printf("post_send_%s %.1f %.1f\n", when, best_ns(plain_send, NULL),
		       best_ns(plugin_send, NULL));
		printf("post_recv_%s %.1f %.1f\n", when, best_ns(plain_recv, NULL),
		       best_ns(plugin_recv, NULL));
		printf("poll_cq_%s %.1f %.1f\n", when, best_ns(plain_poll, NULL),
		       best_ns(plugin_poll, NULL));
	}
	return 0;
}
