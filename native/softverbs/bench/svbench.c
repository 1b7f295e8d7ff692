/*
 * Verbs ping-pong / burst benchmark for softverbs (any libibverbs works).
 *   svbench <server|client> <ud|rc> <size> <iters> <window> <my-info> <peer-info>
 * Each side writes "lid qpn" to my-info and waits for peer-info.
 * window == 0: latency ping-pong, prints "lat_us <one-way usec>".
 * window  > 0: bursts of <window> messages client->server, one 8-byte
 *              reply per burst; prints "bw_MBps <MB/s>".
 */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define QKEY 0x11111111
#define GRH 40

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static struct ibv_mr *mr;
static struct ibv_ah *ah;
static char *buf;
static int ud, depth;
static size_t slot;
static unsigned peer_qpn;
static int send_inflight;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void post_recv(int i)
{
	struct ibv_sge sge = { (uintptr_t)(buf + (size_t)i * slot), slot, mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(qp, &wr, &bad))
		DIE("post_recv");
}

static void post_send(size_t len)
{
	size_t off = (size_t)depth * slot;	/* send buffer after recv slots */
	struct ibv_sge sge = { (uintptr_t)(buf + off), len, mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1000000, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;
	if (len <= 64)
		wr.send_flags |= IBV_SEND_INLINE;
	if (ud) {
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = peer_qpn;
		wr.wr.ud.remote_qkey = QKEY;
	}
	if (ibv_post_send(qp, &wr, &bad))
		DIE("post_send");
	send_inflight++;
}

/* Wait for n receive completions (reposting them), reaping sends too. */
static void wait_recv(int n)
{
	struct ibv_wc wc[32];
	while (n > 0) {
		int k = ibv_poll_cq(cq, 32, wc);
		if (k < 0)
			DIE("poll_cq");
		for (int i = 0; i < k; i++) {
			if (wc[i].status != IBV_WC_SUCCESS)
				DIE("wc error %s", ibv_wc_status_str(wc[i].status));
			if (wc[i].opcode == IBV_WC_SEND) {
				send_inflight--;
				continue;
			}
			post_recv((int)wc[i].wr_id);
			n--;
		}
	}
}

static void reap_sends(int max_inflight)
{
	struct ibv_wc wc;
	while (send_inflight > max_inflight) {
		int k = ibv_poll_cq(cq, 1, &wc);
		if (k < 0 || (k && wc.status != IBV_WC_SUCCESS))
			DIE("send wc %s", k > 0 ? ibv_wc_status_str(wc.status) : "poll");
		if (k && wc.opcode == IBV_WC_SEND)
			send_inflight--;
		else if (k)
			DIE("unexpected recv while reaping");
	}
}

int main(int argc, char **argv)
{
	if (argc != 8)
		DIE("usage");
	int server = !strcmp(argv[1], "server");
	ud = !strcmp(argv[2], "ud");
	size_t size = strtoul(argv[3], NULL, 0);
	int iters = atoi(argv[4]), window = atoi(argv[5]);
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_port_attr port;

	if (!list || !list[0] || !(ctx = ibv_open_device(list[0])))
		DIE("open device");
	depth = window > 0 ? window + 8 : 8;
	slot = size + GRH;
	buf = aligned_alloc(4096, ((size_t)(depth + 1) * slot + 4095) / 4096 * 4096);
	memset(buf, 0x5a, (size_t)(depth + 1) * slot);
	pd = ibv_alloc_pd(ctx);
	mr = ibv_reg_mr(pd, buf, (size_t)(depth + 1) * slot, IBV_ACCESS_LOCAL_WRITE);
	cq = ibv_create_cq(ctx, 4 * depth + 64, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq,
		.cap = { .max_send_wr = depth + 8, .max_recv_wr = depth,
			 .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = 64 },
		.qp_type = ud ? IBV_QPT_UD : IBV_QPT_RC };
	if (!pd || !mr || !cq || !(qp = ibv_create_qp(pd, &ia)))
		DIE("resources");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY,
				 .qp_access_flags = 0 };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  (ud ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS)))
		DIE("init");
	for (int i = 0; i < depth; i++)
		post_recv(i);
	if (ibv_query_port(ctx, 1, &port))
		DIE("query_port");
	FILE *f;
	char tmp[512];
	snprintf(tmp, sizeof(tmp), "%s.tmp", argv[6]);
	f = fopen(tmp, "w");
	fprintf(f, "%u %u\n", port.lid, qp->qp_num);
	fclose(f);
	rename(tmp, argv[6]);
	unsigned plid = 0;
	for (int t = 0; t < 20000; t++) {
		f = fopen(argv[7], "r");
		if (f && fscanf(f, "%u %u", &plid, &peer_qpn) == 2) {
			fclose(f);
			break;
		}
		if (f)
			fclose(f);
		usleep(1000);
	}
	if (!plid)
		DIE("no peer info");
	struct ibv_ah_attr av = { .dlid = plid, .port_num = 1 };
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	if (ud) {
		if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
			DIE("rtr");
		if (!(ah = ibv_create_ah(pd, &av)))
			DIE("ah");
	} else {
		a.path_mtu = IBV_MTU_4096; a.dest_qp_num = peer_qpn; a.rq_psn = 0;
		a.max_dest_rd_atomic = 1; a.min_rnr_timer = 1; a.ah_attr = av;
		if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
			DIE("rtr");
	}
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS; a.sq_psn = 0; a.timeout = 14; a.retry_cnt = 7;
	a.rnr_retry = 7; a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | (ud ? 0 :
			  IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			  IBV_QP_MAX_QP_RD_ATOMIC)))
		DIE("rts");
	/* UD can drop before the peer is in RTR: handshake until both are up */
	sleep(0);
	usleep(100000);

	int warm = iters / 10 + 1;
	double t0 = 0;
	if (window == 0) {
		for (int i = 0; i < iters + warm; i++) {
			if (i == warm)
				t0 = now();
			if (!server) {
				post_send(size);
				wait_recv(1);
			} else {
				wait_recv(1);
				post_send(size);
			}
		}
		reap_sends(0);
		if (!server)
			printf("lat_us %.3f\n", (now() - t0) * 1e6 / iters / 2);
	} else {
		for (int i = 0; i < iters + warm; i++) {
			if (i == warm)
				t0 = now();
			if (!server) {
				for (int w = 0; w < window; w++) {
					reap_sends(depth);
					post_send(size);
				}
				wait_recv(1);
			} else {
				wait_recv(window);
				post_send(8);
			}
		}
		reap_sends(0);
		if (!server)
			printf("bw_MBps %.1f\n", (double)size * window * iters / (now() - t0) / 1e6);
	}
	ibv_destroy_qp(qp);
	if (ah)
		ibv_destroy_ah(ah);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
