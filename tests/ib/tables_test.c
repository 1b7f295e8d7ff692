/*
 * Unit tests of the IB plugin's tables: the id map (lookups, growth,
 * replacement, clearing), the receive log (FIFO order, SRQ removal by
 * wr_id, wrap-around, overflow) and the QP transition history (reset,
 * the kept way up to RTS, the last value of a field).  Prints "ok" lines
 * and exits non-zero on the first failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ib.h"

#define CHECK(cond) do { if (!(cond)) { \
	fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond); exit(1); } } while (0)

/* Stubs for what the tables do not use, so no libibverbs is needed. */
struct ib_ids ib_ids;

static void test_idmap(void)
{
	struct ib_idmap map = IB_IDMAP_INIT;
	uint64_t v;

	CHECK(!ib_idmap_get(&map, 5, &v));
	CHECK(ib_idmap_put(&map, 0, 1) != 0);		/* 0 is the empty slot */
	for (uint64_t k = 1; k <= 5000; k++)		/* grows from 64 slots */
		CHECK(ib_idmap_put(&map, k * 7919, k) == 0);
	for (uint64_t k = 1; k <= 5000; k++)
		CHECK(ib_idmap_get(&map, k * 7919, &v) && v == k);
	CHECK(!ib_idmap_get(&map, 7918, &v));
	CHECK(ib_idmap_put(&map, 7919, 42) == 0 && ib_idmap_get(&map, 7919, &v) && v == 42);
	CHECK(map.used == 5000);
	ib_idmap_clear(&map);
	CHECK(!ib_idmap_get(&map, 7919, &v) && map.used == 0);
	CHECK(ib_idmap_put(&map, 3, 4) == 0 && ib_idmap_get(&map, 3, &v) && v == 4);
	ib_idmap_free(&map);
	printf("ok idmap\n");
}

static struct ibv_recv_wr wr_with(uint64_t id, struct ibv_sge *sge)
{
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = sge, .num_sge = 1 };

	sge->addr = 0x1000 * id;
	sge->length = 64;
	sge->lkey = 77;
	return wr;
}

static void test_recv_log(void)
{
	struct ib_recv_log log;
	struct ibv_sge sge;
	struct ibv_recv_wr wr;

	CHECK(ib_recv_log_init(&log, 4) == 0);
	for (uint64_t id = 1; id <= 4; id++) {
		wr = wr_with(id, &sge);
		CHECK(ib_recv_log_push(&log, &wr) == 0);
	}
	wr = wr_with(5, &sge);
	CHECK(ib_recv_log_push(&log, &wr) != 0);	/* more than the queue holds */
	ib_recv_log_pop_front(&log);			/* QP: completions in order */
	CHECK(ib_recv_log_count(&log) == 3 && ib_recv_log_at(&log, 0)->wr_id == 2);
	ib_recv_log_remove(&log, 3);			/* SRQ: any order */
	CHECK(ib_recv_log_count(&log) == 2);
	CHECK(ib_recv_log_at(&log, 0)->wr_id == 2 && ib_recv_log_at(&log, 1)->wr_id == 4);
	for (uint64_t id = 6; id <= 7; id++) {		/* wraps around the ring */
		wr = wr_with(id, &sge);
		CHECK(ib_recv_log_push(&log, &wr) == 0);
	}
	CHECK(ib_recv_log_count(&log) == 4 && ib_recv_log_at(&log, 3)->wr_id == 7);
	CHECK(ib_recv_log_at(&log, 3)->sge[0].addr == 0x7000 &&
	      ib_recv_log_at(&log, 3)->sge[0].lkey == 77);
	ib_recv_log_remove(&log, 99);			/* unknown: nothing changes */
	CHECK(ib_recv_log_count(&log) == 4);
	free(log.ring);
	memset(&log, 0, sizeof(log));			/* a QP on an SRQ has no log */
	CHECK(ib_recv_log_count(&log) == 0 && ib_recv_log_push(&log, &wr) != 0);
	ib_recv_log_pop_front(&log);
	printf("ok recv log\n");
}

static void transition(struct ib_qp *qp, enum ibv_qp_state state, int extra, uint32_t dest)
{
	struct ibv_qp_attr a = { .qp_state = state, .dest_qp_num = dest };

	ib_history_record(qp, &a, IBV_QP_STATE | extra);
}

static void test_history(void)
{
	struct ib_qp qp;

	memset(&qp, 0, sizeof(qp));
	transition(&qp, IBV_QPS_INIT, 0, 0);
	transition(&qp, IBV_QPS_RTR, IBV_QP_DEST_QPN, 0x1234);
	transition(&qp, IBV_QPS_RTS, 0, 0);
	CHECK(qp.nhistory == 3 && qp.ibv.state == IBV_QPS_RTS);
	CHECK(ib_history_last(&qp, IBV_QP_DEST_QPN)->dest_qp_num == 0x1234);
	for (int i = 0; i < 20; i++)			/* later changes: the way up stays */
		transition(&qp, IBV_QPS_RTS, IBV_QP_DEST_QPN, 0x5000 + i);
	CHECK(qp.nhistory == IB_MAX_HISTORY);
	CHECK(qp.history[0].attr.qp_state == IBV_QPS_INIT &&
	      qp.history[1].attr.dest_qp_num == 0x1234 &&
	      qp.history[2].attr.qp_state == IBV_QPS_RTS);
	CHECK(ib_history_last(&qp, IBV_QP_DEST_QPN)->dest_qp_num == 0x5000 + 19);
	CHECK(!ib_history_last(&qp, IBV_QP_AV));
	transition(&qp, IBV_QPS_RESET, 0, 0);		/* starts over */
	CHECK(qp.nhistory == 0 && qp.ibv.state == IBV_QPS_RESET);
	transition(&qp, IBV_QPS_INIT, 0, 0);		/* up again, then many changes */
	transition(&qp, IBV_QPS_RTR, IBV_QP_DEST_QPN, 0x77);
	transition(&qp, IBV_QPS_RTS, 0, 0);
	for (int i = 0; i < 10; i++)
		transition(&qp, IBV_QPS_RTS, IBV_QP_DEST_QPN, 0x6000 + i);
	CHECK(qp.history[2].attr.qp_state == IBV_QPS_RTS && qp.history[1].attr.dest_qp_num == 0x77);
	printf("ok history\n");
}

int main(void)
{
	test_idmap();
	test_recv_log();
	test_history();
	return 0;
}
