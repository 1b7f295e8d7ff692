/*
 * Many-process UD all-to-all over verbs.
 *   ud_alltoall <rank> <nprocs> <dir> <msgs-per-peer>
 * Every rank publishes "lid qpn" in <dir>/<rank>.info once its QP is in RTS
 * with all receives posted, waits for everyone, then sends msgs-per-peer
 * messages to every other rank through one AH per peer.  Each payload is
 * derived from (src, dst, seq) and is verified on receipt, as are the
 * sender QPN/LID in the completion; duplicates and losses fail the run.
 * Prints "OK <rank> <received>" on success.
 */
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DIE(...) do { printf("FAIL rank %d: ", rank); printf(__VA_ARGS__); \
		      printf("\n"); exit(1); } while (0)
#define QKEY 0x600dcafe
#define GRH 40
#define MAXLEN 512

struct msg {
	uint32_t src, dst, seq, len;
	uint8_t fill[];
};

static int rank;

static uint8_t pattern(uint32_t src, uint32_t dst, uint32_t seq, uint32_t i)
{
	return (uint8_t)(src * 131 + dst * 31 + seq * 7 + i);
}

static uint32_t msg_len(uint32_t src, uint32_t dst, uint32_t seq)
{
	return sizeof(struct msg) + (src * 13 + dst * 5 + seq * 37) % 300;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	if (argc != 5)
		return 2;
	setvbuf(stdout, NULL, _IOLBF, 0);
	rank = atoi(argv[1]);
	int n = atoi(argv[2]), per = atoi(argv[4]);
	const char *dir = argv[3];
	int nrecv = (n - 1) * per, slot = GRH + MAXLEN;
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx;
	struct ibv_port_attr port;

	if (!list || !list[0] || !(ctx = ibv_open_device(list[0])))
		DIE("open");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	size_t rbytes = (size_t)nrecv * slot, total = rbytes + 64 * MAXLEN;
	uint8_t *buf = calloc(1, total);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, total, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_cq *cq = ibv_create_cq(ctx, nrecv + 128, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq,
		.qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 64, .max_recv_wr = nrecv,
			 .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = pd && mr && cq ? ibv_create_qp(pd, &ia) : NULL;

	if (!qp)
		DIE("resources");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qkey = QKEY };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			  IBV_QP_PORT | IBV_QP_QKEY))
		DIE("init");
	for (int i = 0; i < nrecv; i++) {
		struct ibv_sge sge = { (uintptr_t)buf + (size_t)i * slot, slot,
				       mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge,
					  .num_sge = 1 }, *bad;
		if (ibv_post_recv(qp, &wr, &bad))
			DIE("post_recv");
	}
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		DIE("rtr");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		DIE("rts");
	if (ibv_query_port(ctx, 1, &port))
		DIE("query_port");

	char path[512], tmp[520];
	snprintf(path, sizeof(path), "%s/%d.info", dir, rank);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	fprintf(f, "%u %u\n", port.lid, qp->qp_num);
	fclose(f);
	rename(tmp, path);

	unsigned *lids = calloc(n, sizeof(*lids)), *qpns = calloc(n, sizeof(*qpns));
	struct ibv_ah **ah = calloc(n, sizeof(*ah));
	double deadline = now() + 30;

	for (int r = 0; r < n; r++) {
		snprintf(path, sizeof(path), "%s/%d.info", dir, r);
		while (!(f = fopen(path, "r"))) {
			if (now() > deadline)
				DIE("rank %d never came up", r);
			usleep(2000);
		}
		if (fscanf(f, "%u %u", &lids[r], &qpns[r]) != 2)
			DIE("bad info %d", r);
		fclose(f);
		struct ibv_ah_attr av = { .dlid = lids[r], .port_num = 1 };
		if (r != rank && !(ah[r] = ibv_create_ah(pd, &av)))
			DIE("ah");
	}

	uint8_t *seen = calloc((size_t)n * per, 1);
	int received = 0, inflight = 0, sent = 0, to_send = (n - 1) * per;
	struct ibv_wc wc[64];

	deadline = now() + 60;
	while (received < nrecv || sent < to_send || inflight) {
		if (now() > deadline)
			DIE("timeout: received %d/%d sent %d/%d", received,
			    nrecv, sent, to_send);
		/* round-robin over peers so every queue sees traffic */
		while (sent < to_send && inflight < 64) {
			int k = sent % (n - 1), seq = sent / (n - 1);
			int dst = (rank + 1 + k) % n;
			uint8_t *sb = buf + rbytes + (size_t)(sent % 64) * MAXLEN;
			struct msg *m = (struct msg *)sb;
			uint32_t len = msg_len(rank, dst, seq);

			m->src = rank;
			m->dst = dst;
			m->seq = seq;
			m->len = len;
			for (uint32_t i = 0; i < len - sizeof(*m); i++)
				m->fill[i] = pattern(rank, dst, seq, i);
			struct ibv_sge sge = { (uintptr_t)sb, len, mr->lkey };
			struct ibv_send_wr wr = { .wr_id = 1u << 31,
				.sg_list = &sge, .num_sge = 1,
				.opcode = IBV_WR_SEND,
				.send_flags = IBV_SEND_SIGNALED }, *bad;
			wr.wr.ud.ah = ah[dst];
			wr.wr.ud.remote_qpn = qpns[dst];
			wr.wr.ud.remote_qkey = QKEY;
			if (ibv_post_send(qp, &wr, &bad))
				DIE("post_send");
			sent++;
			inflight++;
		}
		int got = ibv_poll_cq(cq, 64, wc);
		if (got < 0)
			DIE("poll_cq");
		for (int i = 0; i < got; i++) {
			if (wc[i].status != IBV_WC_SUCCESS)
				DIE("wc %s", ibv_wc_status_str(wc[i].status));
			if (wc[i].opcode == IBV_WC_SEND) {
				inflight--;
				continue;
			}
			struct msg *m = (struct msg *)(buf +
					 wc[i].wr_id * slot + GRH);
			if (m->dst != (uint32_t)rank || m->src >= (uint32_t)n ||
			    m->seq >= (uint32_t)per)
				DIE("bad header src %u dst %u seq %u", m->src,
				    m->dst, m->seq);
			if (wc[i].byte_len != GRH + m->len ||
			    m->len != msg_len(m->src, rank, m->seq))
				DIE("bad length %u", wc[i].byte_len);
			if (wc[i].src_qp != qpns[m->src] ||
			    wc[i].slid != lids[m->src])
				DIE("bad source qp %u", wc[i].src_qp);
			for (uint32_t j = 0; j < m->len - sizeof(*m); j++)
				if (m->fill[j] != pattern(m->src, rank, m->seq, j))
					DIE("corrupt payload from %u seq %u",
					    m->src, m->seq);
			if (seen[m->src * per + m->seq]++)
				DIE("duplicate from %u seq %u", m->src, m->seq);
			received++;
		}
	}
	printf("OK %d %d\n", rank, received);
	ibv_destroy_qp(qp);
	for (int r = 0; r < n; r++)
		if (ah[r])
			ibv_destroy_ah(ah[r]);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
