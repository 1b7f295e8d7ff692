/*
 * Two processes, one RC connection, and RDMA with keys exchanged once,
 * before any checkpoint: each step the writer RDMA-writes a block into
 * the reader's buffer and tells it with a SEND carrying immediate data;
 * the reader checks the block, RDMA-reads the writer's copy of it back
 * and checks that too, then answers.  After a restart the keys and
 * addresses exchanged at the start must still work.
 *
 *   rc_rdma [steps] [ms-per-step]
 */
#include <arpa/inet.h>
#include <sys/wait.h>
#include "verbs_common.h"

#define BLOCK 4096
#define BLOCKS 64

struct side {
	int me;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint8_t *buf;			/* BLOCKS blocks, then a message and a read slot */
};

static void pattern(uint8_t *p, long step)
{
	uint64_t s = zdtm_mix(step + 1, 0xb10c);

	for (int i = 0; i < BLOCK; i += 8) {
		uint64_t v = zdtm_xorshift(&s);

		memcpy(p + i, &v, 8);
	}
}

static void connect_qp(struct side *s, struct peer_info *peer)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
	};

	zdtm_check(!ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				  IBV_QP_ACCESS_FLAGS), "INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_4096;
	a.dest_qp_num = peer->qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = peer->lid;
	a.ah_attr.port_num = 1;
	zdtm_check(!ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				  IBV_QP_MIN_RNR_TIMER), "RTR");
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 4;
	zdtm_check(!ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC), "RTS");
}

static void setup(struct side *s, struct peer_info *t)
{
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	size_t size = (BLOCKS + 2) * BLOCK;

	s->ctx = open_first_device();
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 32, NULL, NULL, 0);
	s->buf = aligned_alloc(4096, size);
	zdtm_check(s->pd && s->cq && s->buf, "pd/cq");
	memset(s->buf, 0, size);
	s->mr = ibv_reg_mr(s->pd, s->buf, size, IBV_ACCESS_LOCAL_WRITE |
			   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	init.send_cq = init.recv_cq = s->cq;
	s->qp = ibv_create_qp(s->pd, &init);
	zdtm_check(s->mr && s->qp, "mr/qp");
	t[s->me].lid = port_lid(s->ctx);
	t[s->me].qpn = s->qp->qp_num;
	t[s->me].addr = (uintptr_t)s->buf;
	t[s->me].rkey = s->mr->rkey;
	atomic_store(&t[s->me].ready, 1);
	wait_all_ready(t, 2);
	connect_qp(s, &t[1 - s->me]);
}

static void post_recv(struct side *s)
{
	struct ibv_sge sge = { (uintptr_t)(s->buf + BLOCKS * BLOCK), 64, s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad;

	zdtm_check(!ibv_post_recv(s->qp, &wr, &bad), "post_recv");
}

static void post(struct side *s, enum ibv_wr_opcode op, uint8_t *local, uint32_t len,
		 uint64_t remote, uint32_t rkey, uint32_t imm)
{
	struct ibv_sge sge = { (uintptr_t)local, len, s->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = op, .sg_list = &sge, .num_sge = len ? 1 : 0, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(imm),
	}, *bad;

	wr.wr.rdma.remote_addr = remote;
	wr.wr.rdma.rkey = rkey;
	zdtm_check(!ibv_post_send(s->qp, &wr, &bad), "post_send %d", op);
}

/* Wait for a completion of the given kind; returns it. */
static struct ibv_wc wait_for(struct side *s, int recv)
{
	struct ibv_wc wc;

	for (;;) {
		poll_one(s->cq, &wc);
		zdtm_check(wc.status == IBV_WC_SUCCESS, "side %d: completion %s (op %d)", s->me,
			   ibv_wc_status_str(wc.status), (int)wc.wr_id);
		if (!!(wc.opcode & IBV_WC_RECV) == recv)
			return wc;
	}
}

static void writer(struct side *s, struct peer_info *t, long steps, long pace)
{
	struct peer_info *peer = &t[1];

	for (long step = 0; step < steps; step++) {
		uint8_t *block = s->buf + (step % BLOCKS) * BLOCK;

		pattern(block, step);
		post_recv(s);
		post(s, IBV_WR_RDMA_WRITE, block, BLOCK, peer->addr + (step % BLOCKS) * BLOCK,
		     peer->rkey, 0);
		wait_for(s, 0);
		post(s, IBV_WR_SEND_WITH_IMM, NULL, 0, 0, 0, (uint32_t)step);
		wait_for(s, 0);
		wait_for(s, 1);		/* the reader's answer */
		if (pace)
			zdtm_pace(pace);
	}
}

static uint64_t reader(struct side *s, struct peer_info *t, long steps)
{
	struct peer_info *peer = &t[0];
	uint8_t *scratch = s->buf + (BLOCKS + 1) * BLOCK, want[BLOCK];
	uint64_t hash = 0;

	post_recv(s);
	for (long step = 0; step < steps; step++) {
		struct ibv_wc wc = wait_for(s, 1);
		uint8_t *block = s->buf + (step % BLOCKS) * BLOCK;

		zdtm_check(wc.opcode == IBV_WC_RECV && (wc.wc_flags & IBV_WC_WITH_IMM) &&
			   ntohl(wc.imm_data) == (uint32_t)step && 1, "reader: step %ld got %u", step,
			   ntohl(wc.imm_data));
		post_recv(s);
		pattern(want, step);
		zdtm_check(!memcmp(block, want, BLOCK), "reader: RDMA write of step %ld wrong", step);
		memset(scratch, 0, BLOCK);
		post(s, IBV_WR_RDMA_READ, scratch, BLOCK, peer->addr + (step % BLOCKS) * BLOCK,
		     peer->rkey, 0);
		wait_for(s, 0);
		zdtm_check(!memcmp(scratch, want, BLOCK), "reader: RDMA read of step %ld wrong", step);
		hash = zdtm_mix(hash, want[step % BLOCK]);
		post(s, IBV_WR_SEND, NULL, 0, 0, 0, 0);
		wait_for(s, 0);
	}
	return hash;
}

int main(int argc, char **argv)
{
	long steps = 3000, pace = 1;
	struct peer_info *t = peer_table(2);
	pid_t pids[2];

	zdtm_args(argc, argv, &steps, &pace);
	setvbuf(stdout, NULL, _IONBF, 0);
	for (int i = 0; i < 2; i++) {
		pids[i] = fork();
		zdtm_check(pids[i] >= 0, "fork");
		if (pids[i] == 0) {
			struct side s = { .me = i };

			setup(&s, t);
			if (i == 0)
				writer(&s, t, steps, pace);
			else
				t[1].result = reader(&s, t, steps);
			t[i].done = 1;
			/* the device acknowledges the peer's last message only
			 * while the QP lives: stay until the peer is done */
			while (!t[1 - i].done)
				zdtm_pace(1);
			zdtm_hold();	/* with the connection up */
			exit(0);
		}
	}
	wait_all_ready(t, 2);
	printf("READY\n");
	for (int i = 0; i < 2; i++) {
		int status;

		zdtm_check(waitpid(pids[i], &status, 0) == pids[i], "waitpid");
		zdtm_check(WIFEXITED(status) && !WEXITSTATUS(status) && t[i].done,
			   "side %d ended with status %#x", i, status);
	}
	zdtm_pass("%ld steps, %016llx", steps, (unsigned long long)t[1].result);
	return 0;
}
