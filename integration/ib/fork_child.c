/*
 * A verbs process forks (no exec) a child that opens the device itself, as
 * a library's helper process or an MPI program's fork()ed worker does.
 * Parent and child each send UD messages to themselves through the
 * checkpoints: each must rebuild only its own objects (the child has the
 * parent's in its memory but cannot use them, as with a real HCA), and
 * both go on with every message intact after a restart.
 *
 *   fork_child [rounds] [ms-per-round]
 */
#include <sys/wait.h>
#include "verbs_common.h"

#define QKEY 0x44444444
#define GRH 40
#define PAYLOAD 64
#define CHILD_STATUS 7

struct loopback {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	struct ibv_ah *ah;
	uint8_t buf[2 * (GRH + PAYLOAD)];
};

static void setup(struct loopback *l)
{
	struct ibv_qp_init_attr init = { .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	struct ibv_ah_attr ah = { .port_num = 1 };

	l->ctx = open_first_device();
	l->pd = ibv_alloc_pd(l->ctx);
	l->cq = l->pd ? ibv_create_cq(l->ctx, 8, NULL, NULL, 0) : NULL;
	zdtm_check(l->cq != NULL, "pd/cq: %m");
	init.send_cq = init.recv_cq = l->cq;
	l->qp = ibv_create_qp(l->pd, &init);
	zdtm_check(l->qp != NULL, "create_qp: %m");
	zdtm_check(!ibv_modify_qp(l->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				  IBV_QP_QKEY), "INIT");
	a.qp_state = IBV_QPS_RTR;
	zdtm_check(!ibv_modify_qp(l->qp, &a, IBV_QP_STATE), "RTR");
	a.qp_state = IBV_QPS_RTS;
	zdtm_check(!ibv_modify_qp(l->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), "RTS");
	l->mr = ibv_reg_mr(l->pd, l->buf, sizeof(l->buf), IBV_ACCESS_LOCAL_WRITE);
	ah.dlid = port_lid(l->ctx);
	l->ah = ibv_create_ah(l->pd, &ah);
	zdtm_check(l->mr && l->ah, "mr/ah: %m");
}

/* One message to itself: sent, received, its payload checked. */
static uint64_t loop_message(struct loopback *l, int who, long round)
{
	uint8_t *in = l->buf, *out = l->buf + GRH + PAYLOAD;
	struct ibv_sge rs = { (uintptr_t)in, GRH + PAYLOAD, l->mr->lkey };
	struct ibv_sge ss = { (uintptr_t)out, PAYLOAD, l->mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *bad_r;
	struct ibv_send_wr sw = { .wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad_s;
	uint64_t seed = zdtm_mix(who + 1, round + 1);
	struct ibv_wc wc;

	for (int i = 0; i < PAYLOAD; i++)
		out[i] = (uint8_t)zdtm_xorshift(&seed);
	zdtm_check(!ibv_post_recv(l->qp, &rw, &bad_r), "post_recv");
	sw.wr.ud.ah = l->ah;
	sw.wr.ud.remote_qpn = l->qp->qp_num;
	sw.wr.ud.remote_qkey = QKEY;
	zdtm_check(!ibv_post_send(l->qp, &sw, &bad_s), "post_send");
	for (int got = 0; got < 2; got++) {
		poll_one(l->cq, &wc);
		zdtm_check(wc.status == IBV_WC_SUCCESS, "%s round %ld: %s",
			   who ? "child" : "parent", round, ibv_wc_status_str(wc.status));
	}
	zdtm_check(!memcmp(in + GRH, out, PAYLOAD), "%s round %ld: payload differs",
		   who ? "child" : "parent", round);
	return seed;
}

static uint64_t rounds_of(struct loopback *l, int who, long rounds, long pace)
{
	uint64_t hash = 0;

	for (long round = 0; round < rounds; round++) {
		hash = zdtm_mix(hash, loop_message(l, who, round));
		zdtm_pace(pace);
	}
	return hash;
}

int main(int argc, char **argv)
{
	long rounds = 300, pace = 5;
	struct loopback parent, child;
	uint64_t hash;
	int go[2], status;
	pid_t pid;
	char c;

	zdtm_args(argc, argv, &rounds, &pace);
	setvbuf(stdout, NULL, _IOLBF, 0);
	setup(&parent);
	zdtm_check(!pipe(go), "pipe");
	pid = fork();
	zdtm_check(pid >= 0, "fork");
	if (pid == 0) {
		close(go[1]);
		setup(&child);
		hash = rounds_of(&child, 1, rounds, pace);
		zdtm_check(read(go[0], &c, 1) == 0, "the parent's end");
		loop_message(&child, 1, rounds);	/* after the parent's hold */
		_exit(hash ? CHILD_STATUS : 1);
	}
	close(go[0]);
	printf("READY\n");
	hash = rounds_of(&parent, 0, rounds, pace);
	zdtm_hold();
	hash = zdtm_mix(hash, loop_message(&parent, 0, rounds));
	close(go[1]);
	zdtm_check(waitpid(pid, &status, 0) == pid, "waitpid: %m");
	zdtm_check(WIFEXITED(status) && WEXITSTATUS(status) == CHILD_STATUS,
		   "the child ended with status %#x", status);
	zdtm_pass("%ld rounds in each, %016llx", rounds, (unsigned long long)hash);
	return 0;
}
