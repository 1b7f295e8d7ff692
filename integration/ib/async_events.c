/*
 * Async events as UCX's RC transport uses them: the main thread moves an
 * SRQ-attached QP to the error state (the device then raises "last WQE
 * reached" for it) and destroys it; a second thread reads the events and
 * holds each one a while before it acks it.  libibverbs promises that a
 * destroy waits until every event of the object that was read is acked,
 * and that the events of a destroyed object nobody read are gone, so the
 * event thread only ever sees the QP that exists now.  Checkpoints and a
 * restart (which release and rebuild the device under both threads) must
 * keep that promise and never hang the destroy.
 *
 *   async_events [rounds] [ms-per-round]
 */
#include <pthread.h>
#include "verbs_common.h"

#define HOLD_MS 20

static struct ibv_context *ctx;
static struct ibv_qp *_Atomic current;	/* the QP that exists, or NULL */
static _Atomic long alive_round = -1;	/* its round (a new QP may reuse
					   the address of the one before) */
static _Atomic long events;

static void *event_thread(void *arg)
{
	(void)arg;
	for (;;) {
		struct ibv_async_event ev;

		zdtm_check(!ibv_get_async_event(ctx, &ev), "get_async_event: %m");
		zdtm_check(ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED,
			   "unexpected event %s", ibv_event_type_str(ev.event_type));
		long round = atomic_load(&alive_round);

		zdtm_check(round >= 0 && ev.element.qp == atomic_load(&current),
			   "an event names QP %p, not the one that exists (%p)",
			   (void *)ev.element.qp, (void *)atomic_load(&current));
		zdtm_pace(HOLD_MS);	/* a destroy now has to wait for us */
		zdtm_check(atomic_load(&alive_round) == round,
			   "the QP of round %ld was destroyed before its event was acked",
			   round);
		atomic_fetch_add(&events, 1);
		ibv_ack_async_event(&ev);
	}
	return NULL;
}

static struct ibv_qp *qp_in_error(struct ibv_pd *pd, struct ibv_cq *cq,
				  struct ibv_srq *srq, long round)
{
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .srq = srq,
		.qp_type = IBV_QPT_RC, .cap = { .max_send_wr = 4, .max_send_sge = 1 } };
	struct ibv_qp_attr init = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE };
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);

	zdtm_check(qp != NULL, "create_qp: %m");
	atomic_store(&current, qp);
	atomic_store(&alive_round, round);
	zdtm_check(!ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				  IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), "to INIT");
	zdtm_check(!ibv_modify_qp(qp, &err, IBV_QP_STATE), "to ERR");
	return qp;
}

int main(int argc, char **argv)
{
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
	long rounds = 300, pace = 5;
	uint64_t hash = 0;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_srq *srq;
	pthread_t t;

	zdtm_args(argc, argv, &rounds, &pace);
	setvbuf(stdout, NULL, _IOLBF, 0);
	ctx = open_first_device();
	pd = ibv_alloc_pd(ctx);
	cq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	srq = cq ? ibv_create_srq(pd, &sa) : NULL;
	zdtm_check(srq != NULL, "pd/cq/srq: %m");
	zdtm_check(!pthread_create(&t, NULL, event_thread, NULL), "pthread_create");
	printf("READY\n");
	for (long round = 0; round < rounds; round++) {
		struct ibv_qp *qp = qp_in_error(pd, cq, srq, round);

		zdtm_pace(pace);
		zdtm_check(!ibv_destroy_qp(qp), "destroy_qp: %m");
		atomic_store(&alive_round, -1);
		atomic_store(&current, NULL);
		hash = zdtm_mix(hash, round);
	}
	zdtm_hold();
	zdtm_check(atomic_load(&events) > 0, "no event was ever delivered");
	zdtm_check(!ibv_destroy_srq(srq) && !ibv_destroy_cq(cq), "cleanup");
	zdtm_pass("%ld rounds, %016llx", rounds, (unsigned long long)hash);
	return 0;
}
