/*
 * The cost of the verbs data path in one process, for the IB plugin's
 * benchmark: an empty ibv_poll_cq, and a UD send of 8 inline bytes to the
 * process's own QP followed by polling for both completions (post_send,
 * post_recv, poll_cq).  Prints "poll_ns <x>" and "sendrecv_ns <y>".
 *
 *   verbs_ops [iterations]
 */
#include <infiniband/verbs.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define QKEY 0x11111111
#define BLOCKS 20

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
	fprintf(stderr, "verbs_ops: %s failed\n", what);
	exit(1);
}

int main(int argc, char **argv)
{
	long iters = argc > 1 ? atol(argv[1]) : 200000;
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	struct ibv_ah *ah;
	struct ibv_port_attr port;
	struct ibv_wc wc[4];
	static char buf[4096];
	double t0, poll_ns, sr_ns;

	if (!list || !list[0] || !(ctx = ibv_open_device(list[0])))
		die("open device");
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!cq || !mr)
		die("pd/cq/mr");
	{
		struct ibv_qp_init_attr init = {
			.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
			.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
				 .max_recv_sge = 1, .max_inline_data = 64 },
		};
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };

		qp = ibv_create_qp(pd, &init);
		if (!qp || ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					 IBV_QP_QKEY))
			die("qp init");
		a.qp_state = IBV_QPS_RTR;
		if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
			die("rtr");
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = 0;
		if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
			die("rts");
	}
	if (ibv_query_port(ctx, 1, &port))
		die("query port");
	{
		struct ibv_ah_attr aa = { .dlid = port.lid, .port_num = 1 };

		ah = ibv_create_ah(pd, &aa);
		if (!ah)
			die("ah");
	}
	poll_ns = sr_ns = 1e30;
	for (int block = 0; block < BLOCKS; block++) {
	t0 = now();
	for (long i = 0; i < iters / BLOCKS; i++)
		if (ibv_poll_cq(cq, 4, wc))
			die("empty poll");
	poll_ns = fmin(poll_ns, (now() - t0) * 1e9 / (iters / BLOCKS));
	}

	for (int block = 0; block < BLOCKS; block++) {
	t0 = now();
	for (long i = 0; i < iters / BLOCKS; i++) {
		struct ibv_sge rs = { (uintptr_t)buf, 128, mr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *rbad;
		struct ibv_sge ss = { (uintptr_t)(buf + 1024), 8, mr->lkey };
		struct ibv_send_wr swr = {
			.wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
			.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE,
		}, *sbad;
		int done = 0;

		swr.wr.ud.ah = ah;
		swr.wr.ud.remote_qpn = qp->qp_num;
		swr.wr.ud.remote_qkey = QKEY;
		if (ibv_post_recv(qp, &rwr, &rbad) || ibv_post_send(qp, &swr, &sbad))
			die("post");
		while (done < 2) {
			int n = ibv_poll_cq(cq, 4, wc);

			if (n < 0)
				die("poll");
			for (int k = 0; k < n; k++)
				if (wc[k].status != IBV_WC_SUCCESS)
					die("completion");
			done += n;
		}
	}
	sr_ns = fmin(sr_ns, (now() - t0) * 1e9 / (iters / BLOCKS));
	}
	printf("poll_ns %.1f\nsendrecv_ns %.1f\n", poll_ns, sr_ns);
	return 0;
}
