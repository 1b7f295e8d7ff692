/*
 * Every process sends to every other through one UD QP and an address
 * handle per peer, in rounds: a round's message to each peer, then wait
 * for every peer's message of that round.  Each message carries sender,
 * round and a checksum of its payload; a receiver checks that each
 * sender's rounds come exactly once and in order, and every payload.
 * A peer is at most one round ahead, so the receives posted always
 * suffice and no message is dropped for want of one.
 *
 *   ud_mesh [processes] [rounds] [ms-per-round]
 *   ud_mesh --rank I --of N --dir DIR [rounds] [ms-per-round]
 *
 * The second form is one rank of N, started on any host: ranks find each
 * other's LID and QPN in files DIR/rank-I (DIR on a filesystem the hosts
 * share), and each prints its own RESULT.
 */
#include <sys/wait.h>
#include "verbs_common.h"

#define MAXP 16
#define PAYLOAD 256
#define GRH 40
#define SLOT (GRH + PAYLOAD)
#define QKEY 0x11111111

struct msg {
	uint32_t src, round;
	uint64_t sum;
	uint8_t data[PAYLOAD - 16];
};

static const char *rendezvous;	/* --dir: ranks meet in files, not memory */

/* This rank's address in DIR/rank-ME, then every other rank's. */
static void meet_in_files(struct peer_info *t, int me, int n)
{
	char path[4096], tmp[4096];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s/.rank-%d.tmp", rendezvous, me);
	snprintf(path, sizeof(path), "%s/rank-%d", rendezvous, me);
	f = fopen(tmp, "w");
	zdtm_check(f && fprintf(f, "%u %u\n", t[me].lid, t[me].qpn) > 0 && !fclose(f), "%s", tmp);
	zdtm_check(!rename(tmp, path), "rename %s", path);
	for (int p = 0; p < n; p++) {
		unsigned lid, qpn;

		snprintf(path, sizeof(path), "%s/rank-%d", rendezvous, p);
		while (!(f = fopen(path, "r")))
			zdtm_pace(10);
		zdtm_check(fscanf(f, "%u %u", &lid, &qpn) == 2, "%s", path);
		fclose(f);
		t[p].lid = lid;
		t[p].qpn = qpn;
	}
}

static uint64_t fill(struct msg *m, int src, int dst, uint32_t round)
{
	uint64_t s = zdtm_mix(zdtm_mix(src + 1, dst + 1), round + 1), sum = 0;

	for (size_t i = 0; i < sizeof(m->data); i++) {
		if (i % 8 == 0)
			zdtm_xorshift(&s);
		m->data[i] = (uint8_t)(s >> (8 * (i % 8)));
		sum = zdtm_mix(sum, m->data[i]);
	}
	m->src = src;
	m->round = round;
	return sum;
}

struct rank {
	int me, n;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	struct ibv_ah *ah[MAXP];
	uint8_t *buf;			/* recv slots, then one send slot per peer */
	int nrecv;
	uint32_t next_round[MAXP];	/* what each sender sends next */
	int got_in_round[2];		/* messages of round r and r+1 received */
	int sends_left;
	uint64_t hash;
};

static void post_recv(struct rank *r, int slot)
{
	struct ibv_sge sge = { (uintptr_t)(r->buf + slot * SLOT), SLOT, r->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 }, *bad;

	zdtm_check(ibv_post_recv(r->qp, &wr, &bad) == 0, "post_recv");
}

static void setup(struct rank *r, struct peer_info *t)
{
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 2 * MAXP, .max_recv_wr = 4 * MAXP,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qkey = QKEY };
	size_t size = (size_t)(r->nrecv + MAXP) * SLOT;

	r->ctx = open_first_device();
	r->pd = ibv_alloc_pd(r->ctx);
	r->cq = ibv_create_cq(r->ctx, 8 * MAXP, NULL, NULL, 0);
	r->buf = calloc(1, size);
	zdtm_check(r->pd && r->cq && r->buf, "pd/cq");
	r->mr = ibv_reg_mr(r->pd, r->buf, size, IBV_ACCESS_LOCAL_WRITE);
	init.send_cq = init.recv_cq = r->cq;
	r->qp = ibv_create_qp(r->pd, &init);
	zdtm_check(r->mr && r->qp, "mr/qp");
	zdtm_check(!ibv_modify_qp(r->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				  IBV_QP_QKEY), "INIT");
	a.qp_state = IBV_QPS_RTR;
	zdtm_check(!ibv_modify_qp(r->qp, &a, IBV_QP_STATE), "RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	zdtm_check(!ibv_modify_qp(r->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), "RTS");
	for (int s = 0; s < r->nrecv; s++)
		post_recv(r, s);
	t[r->me].lid = port_lid(r->ctx);
	t[r->me].qpn = r->qp->qp_num;
	if (rendezvous) {
		meet_in_files(t, r->me, r->n);
		printf("READY %d\n", r->me);
	} else {
		atomic_store(&t[r->me].ready, 1);
		wait_all_ready(t, r->n);
	}
	for (int p = 0; p < r->n; p++) {
		struct ibv_ah_attr ah = { .dlid = t[p].lid, .port_num = 1 };

		if (p == r->me)
			continue;
		r->ah[p] = ibv_create_ah(r->pd, &ah);
		zdtm_check(r->ah[p] != NULL, "create_ah to %d", p);
	}
}

static void send_round(struct rank *r, struct peer_info *t, uint32_t round)
{
	for (int p = 0; p < r->n; p++) {
		uint8_t *slot = r->buf + (size_t)(r->nrecv + p) * SLOT;
		struct msg *m = (struct msg *)slot;
		struct ibv_sge sge = { (uintptr_t)slot, PAYLOAD, r->mr->lkey };
		struct ibv_send_wr wr = {
			.wr_id = 1000 + p, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
			.send_flags = IBV_SEND_SIGNALED,
		}, *bad;

		if (p == r->me)
			continue;
		m->sum = fill(m, r->me, p, round);
		wr.wr.ud.ah = r->ah[p];
		wr.wr.ud.remote_qpn = t[p].qpn;
		wr.wr.ud.remote_qkey = QKEY;
		zdtm_check(ibv_post_send(r->qp, &wr, &bad) == 0, "post_send to %d", p);
		r->sends_left++;
	}
}

static void received(struct rank *r, struct ibv_wc *wc, uint32_t round)
{
	struct msg *m = (struct msg *)(r->buf + wc->wr_id * SLOT + GRH), want;
	uint32_t src = m->src;

	zdtm_check(wc->byte_len == GRH + PAYLOAD, "rank %d: %u bytes", r->me, wc->byte_len);
	zdtm_check(src < (uint32_t)r->n && src != (uint32_t)r->me, "rank %d: sender %u", r->me, src);
	zdtm_check(m->round == r->next_round[src], "rank %d: from %u round %u, expected %u "
		   "(lost or duplicated)", r->me, src, m->round, r->next_round[src]);
	zdtm_check(m->sum == fill(&want, src, r->me, m->round) &&
		   !memcmp(m->data, want.data, sizeof(want.data)),
		   "rank %d: corrupt payload from %u round %u", r->me, src, m->round);
	zdtm_check(m->round == round || m->round == round + 1, "rank %d: round %u during %u",
		   r->me, m->round, round);
	r->got_in_round[m->round - round]++;
	r->next_round[src]++;
	r->hash += zdtm_mix(src, m->sum);	/* arrival order varies */
	post_recv(r, (int)wc->wr_id);
}

static void run_rank(int me, int n, long rounds, long pace, struct peer_info *t)
{
	struct rank r = { .me = me, .n = n, .nrecv = 3 * MAXP };
	struct ibv_wc wc;

	setup(&r, t);
	for (uint32_t round = 0; round < rounds; round++) {
		send_round(&r, t, round);
		while (r.got_in_round[0] < n - 1 || r.sends_left) {
			poll_one(r.cq, &wc);
			zdtm_check(wc.status == IBV_WC_SUCCESS, "rank %d: completion %s", me,
				   ibv_wc_status_str(wc.status));
			if (wc.opcode & IBV_WC_RECV)
				received(&r, &wc, round);
			else
				r.sends_left--;
		}
		r.got_in_round[0] = r.got_in_round[1];
		r.got_in_round[1] = 0;
		if (pace)
			zdtm_pace(pace);
	}
	zdtm_hold();
	for (int p = 0; p < n; p++)
		zdtm_check(p == me || r.next_round[p] == rounds, "rank %d: %u rounds from %d",
			   me, r.next_round[p], p);
	t[me].result = r.hash;
	t[me].done = 1;
	if (rendezvous)
		zdtm_pass("rank %d of %d, %ld rounds, %016llx", me, n, rounds,
			  (unsigned long long)r.hash);
	exit(0);
}

int main(int argc, char **argv)
{
	long n = 8, rounds = 2000, pace = 1;
	struct peer_info *t;
	pid_t pids[MAXP];
	uint64_t total = 0;

	if (argc >= 7 && !strcmp(argv[1], "--rank") && !strcmp(argv[3], "--of") &&
	    !strcmp(argv[5], "--dir")) {
		int me = atoi(argv[2]);

		setvbuf(stdout, NULL, _IOLBF, 0);	/* ranks share a pipe: whole lines */
		n = atol(argv[4]);
		rendezvous = argv[6];
		rounds = argc > 7 ? atol(argv[7]) : rounds;
		pace = argc > 8 ? atol(argv[8]) : pace;
		zdtm_check(n >= 2 && n <= MAXP && me >= 0 && me < n, "rank %d of %ld", me, n);
		run_rank(me, n, rounds, pace, peer_table(n));
	}
	if (argc > 1)
		n = atol(argv[1]);
	if (argc > 2)
		rounds = atol(argv[2]);
	if (argc > 3)
		pace = atol(argv[3]);
	zdtm_check(n >= 2 && n <= MAXP, "2 to %d processes", MAXP);
	t = peer_table(n);
	setvbuf(stdout, NULL, _IONBF, 0);
	for (int i = 0; i < n; i++) {
		pids[i] = fork();
		zdtm_check(pids[i] >= 0, "fork");
		if (pids[i] == 0)
			run_rank(i, n, rounds, pace, t);
	}
	wait_all_ready(t, n);
	printf("READY\n");
	for (int i = 0; i < n; i++) {
		int status;

		zdtm_check(waitpid(pids[i], &status, 0) == pids[i], "waitpid");
		zdtm_check(WIFEXITED(status) && !WEXITSTATUS(status) && t[i].done,
			   "rank %d ended with status %#x", i, status);
		total = zdtm_mix(total, t[i].result);
	}
	zdtm_pass("%d processes, %ld rounds, %ld messages each, %016llx", (int)n, rounds,
		  rounds * (n - 1), (unsigned long long)total);
	return 0;
}
