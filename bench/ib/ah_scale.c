/*
 * Verbs state of a given size for the rebuild benchmark: QPS UD queue
 * pairs with receives posted and AHS address handles, then it idles
 * (polling now and then) until its stdin closes.
 *
 *   ah_scale <qps> <ahs>
 */
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void die(const char *what)
{
	fprintf(stderr, "ah_scale: %s failed\n", what);
	exit(1);
}

int main(int argc, char **argv)
{
	int nqp = argc > 1 ? atoi(argv[1]) : 1, nah = argc > 2 ? atoi(argv[2]) : 1;
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx;
	struct ibv_port_attr port;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	static char buf[1 << 16];
	struct pollfd in = { 0, POLLIN, 0 };

	if (!list || !list[0] || !(ctx = ibv_open_device(list[0])))
		die("open device");
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 4096, NULL, NULL, 0);
	mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!cq || !mr || ibv_query_port(ctx, 1, &port))
		die("pd/cq/mr");
	for (int q = 0; q < nqp; q++) {
		struct ibv_qp_init_attr init = {
			.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
			.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
				 .max_recv_sge = 1 },
		};
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 1 };
		struct ibv_qp *qp = ibv_create_qp(pd, &init);

		if (!qp || ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					 IBV_QP_QKEY))
			die("qp");
		a.qp_state = IBV_QPS_RTR;
		if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
			die("rtr");
		a.qp_state = IBV_QPS_RTS;
		if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
			die("rts");
		for (int r = 0; r < 4; r++) {
			struct ibv_sge sge = { (uintptr_t)buf, 256, mr->lkey };
			struct ibv_recv_wr wr = { .wr_id = r, .sg_list = &sge, .num_sge = 1 }, *bad;

			if (ibv_post_recv(qp, &wr, &bad))
				die("post_recv");
		}
	}
	for (int i = 0; i < nah; i++) {
		struct ibv_ah_attr aa = { .dlid = port.lid, .port_num = 1, .sl = i % 16 };

		if (!ibv_create_ah(pd, &aa))
			die("ah");
	}
	printf("READY\n");
	fflush(stdout);
	while (poll(&in, 1, 20) == 0) {
		struct ibv_wc wc;

		ibv_poll_cq(cq, 1, &wc);
	}
	return 0;
}
