/*
 * Completion channels as event loops watch them (Open MPI's progress
 * thread polls its connection manager's channel, UCX waits on its fds in
 * epoll): two channels, each with a CQ behind a UD QP that receives.
 *
 *  - busy: its CQ is armed and a message arrives before the checkpoints,
 *    and nobody reads the event: the channel's fd stays readable (poll and
 *    epoll) across every checkpoint and restart, and ibv_get_cq_event then
 *    hands out that event for that CQ, whose completion is the message,
 *    intact.  After that the fd is quiet until the next message, whose
 *    event comes through the same fd number.
 *  - idle: its CQ is armed and nothing arrives: a thread polls its fd every
 *    millisecond and must never see it ready, also while a checkpoint runs
 *    (a placeholder that polled ready sent the thread into
 *    ibv_get_cq_event for good).  It is non-blocking, as UCX makes its
 *    channels, and stays so; a message at the end makes it ready.
 *
 *   comp_events [steps] [ms-per-step]
 */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include "verbs_common.h"

#define GRH 40
#define PAYLOAD 64
#define SLOT (GRH + PAYLOAD)
#define QKEY 0x22222222

enum { BUSY, IDLE, NCHAN };

struct receiver {
	struct ibv_comp_channel *channel;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	uint8_t *slot;
};

static struct ibv_pd *pd;
static struct ibv_mr *mr;
static uint8_t *buf;
static struct ibv_qp *sender;
static struct ibv_cq *send_cq;
static struct ibv_ah *self_ah;
static struct receiver rx[NCHAN];
static _Atomic int watching = 1;
static _Atomic long idle_ready;	/* times the idle channel polled ready */
static _Atomic long idle_polls;

static struct ibv_qp *ud_qp(struct ibv_cq *scq, struct ibv_cq *rcq)
{
	struct ibv_qp_init_attr init = { .send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	struct ibv_qp *qp = ibv_create_qp(pd, &init);

	zdtm_check(qp != NULL, "create_qp: %m");
	zdtm_check(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				  IBV_QP_QKEY), "INIT");
	a.qp_state = IBV_QPS_RTR;
	zdtm_check(!ibv_modify_qp(qp, &a, IBV_QP_STATE), "RTR");
	a.qp_state = IBV_QPS_RTS;
	zdtm_check(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), "RTS");
	return qp;
}

static void post_recv(struct receiver *r)
{
	struct ibv_sge sge = { (uintptr_t)r->slot, SLOT, mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;

	zdtm_check(!ibv_post_recv(r->qp, &wr, &bad), "post_recv");
}

static void fill(uint8_t *p, int which, int seq)
{
	uint64_t s = zdtm_mix(which + 1, seq + 1);

	for (int i = 0; i < PAYLOAD; i++) {
		if (i % 8 == 0)
			zdtm_xorshift(&s);
		p[i] = (uint8_t)(s >> (8 * (i % 8)));
	}
}

/* One message to a receiver; its send completion is taken here. */
static void send_to(int which, int seq)
{
	uint8_t *slot = buf + NCHAN * SLOT;
	struct ibv_sge sge = { (uintptr_t)slot, PAYLOAD, mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_wc wc;

	fill(slot, which, seq);
	wr.wr.ud.ah = self_ah;
	wr.wr.ud.remote_qpn = rx[which].qp->qp_num;
	wr.wr.ud.remote_qkey = QKEY;
	zdtm_check(!ibv_post_send(sender, &wr, &bad), "post_send");
	poll_one(send_cq, &wc);
	zdtm_check(wc.status == IBV_WC_SUCCESS, "send: %s", ibv_wc_status_str(wc.status));
}

static int readable(int fd, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int n = poll(&p, 1, timeout_ms);

	zdtm_check(n >= 0, "poll: %m");
	zdtm_check(!(p.revents & (POLLERR | POLLNVAL)), "poll fd %d: revents %#x", fd, p.revents);
	return n == 1 && (p.revents & POLLIN);
}

/* Which channels the epoll set reports ready now, as a bit mask. */
static int epoll_ready(int ep, int timeout_ms)
{
	struct epoll_event ev[NCHAN];
	int n = epoll_wait(ep, ev, NCHAN, timeout_ms), mask = 0;

	zdtm_check(n >= 0, "epoll_wait: %m");
	for (int i = 0; i < n; i++)
		mask |= 1 << ev[i].data.u32;
	return mask;
}

/* The event of the receiver's CQ, its completion: the message seq. */
static void take_message(int which, int seq)
{
	struct receiver *r = &rx[which];
	struct ibv_cq *cq;
	struct ibv_wc wc;
	uint8_t want[PAYLOAD];
	void *context;

	zdtm_check(!ibv_get_cq_event(r->channel, &cq, &context), "get_cq_event: %m");
	zdtm_check(cq == r->cq && context == r, "the event names CQ %p, not %p",
		   (void *)cq, (void *)r->cq);
	ibv_ack_cq_events(cq, 1);
	zdtm_check(!ibv_req_notify_cq(cq, 0), "req_notify_cq");
	poll_one(cq, &wc);
	zdtm_check(wc.status == IBV_WC_SUCCESS && wc.byte_len == GRH + PAYLOAD,
		   "receive: %s, %u bytes", ibv_wc_status_str(wc.status), wc.byte_len);
	fill(want, which, seq);
	zdtm_check(!memcmp(r->slot + GRH, want, PAYLOAD), "message %d of channel %d corrupt",
		   seq, which);
	zdtm_check(ibv_poll_cq(cq, 1, &wc) == 0, "a completion too many");
	post_recv(r);
}

static void *watch_idle(void *arg)
{
	(void)arg;
	while (atomic_load(&watching)) {
		if (readable(rx[IDLE].channel->fd, 1))
			atomic_fetch_add(&idle_ready, 1);
		atomic_fetch_add(&idle_polls, 1);
	}
	return NULL;
}

static void setup(void)
{
	struct ibv_context *ctx = open_first_device();
	struct ibv_ah_attr ah = { .dlid = port_lid(ctx), .port_num = 1 };
	size_t size = (NCHAN + 1) * SLOT;

	pd = ibv_alloc_pd(ctx);
	buf = calloc(1, size);
	zdtm_check(pd && buf, "pd");
	mr = ibv_reg_mr(pd, buf, size, IBV_ACCESS_LOCAL_WRITE);
	send_cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	zdtm_check(mr && send_cq, "mr/cq");
	for (int i = 0; i < NCHAN; i++) {
		struct receiver *r = &rx[i];

		r->channel = ibv_create_comp_channel(ctx);
		zdtm_check(r->channel != NULL, "create_comp_channel: %m");
		r->cq = ibv_create_cq(ctx, 8, r, r->channel, 0);
		zdtm_check(r->cq != NULL, "create_cq: %m");
		r->qp = ud_qp(send_cq, r->cq);
		r->slot = buf + i * SLOT;
		post_recv(r);
		zdtm_check(!ibv_req_notify_cq(r->cq, 0), "req_notify_cq");
	}
	zdtm_check(!fcntl(rx[IDLE].channel->fd, F_SETFL, O_NONBLOCK), "O_NONBLOCK: %m");
	sender = ud_qp(send_cq, send_cq);
	self_ah = ibv_create_ah(pd, &ah);
	zdtm_check(self_ah != NULL, "create_ah: %m");
}

int main(int argc, char **argv)
{
	long steps = 200, pace = 10;
	int ep = epoll_create1(EPOLL_CLOEXEC);
	pthread_t watcher;

	zdtm_args(argc, argv, &steps, &pace);
	setvbuf(stdout, NULL, _IOLBF, 0);
	setup();
	for (int i = 0; i < NCHAN; i++) {
		struct epoll_event ev = { .events = EPOLLIN, .data.u32 = i };

		zdtm_check(!epoll_ctl(ep, EPOLL_CTL_ADD, rx[i].channel->fd, &ev), "epoll_ctl: %m");
	}
	send_to(BUSY, 0);
	zdtm_check(readable(rx[BUSY].channel->fd, 5000), "no event for the first message");
	zdtm_check(!pthread_create(&watcher, NULL, watch_idle, NULL), "pthread_create");
	printf("READY\n");
	/* checkpoints come now: the busy channel's event stays unread */
	for (long step = 0; step < steps; step++) {
		zdtm_check(readable(rx[BUSY].channel->fd, 0), "step %ld: the unread event is gone",
			   step);
		zdtm_check(epoll_ready(ep, 0) == 1 << BUSY, "step %ld: epoll reports %#x", step,
			   epoll_ready(ep, 0));
		zdtm_pace(pace);
	}
	zdtm_hold();
	zdtm_check(readable(rx[BUSY].channel->fd, 0) && epoll_ready(ep, 0) == 1 << BUSY,
		   "after the hold: the unread event is gone");
	take_message(BUSY, 0);
	zdtm_check(!readable(rx[BUSY].channel->fd, 0), "an event with none raised");
	send_to(BUSY, 1);
	zdtm_check(readable(rx[BUSY].channel->fd, 5000), "no event for the second message");
	zdtm_check(epoll_ready(ep, 5000) == 1 << BUSY, "epoll misses the second message's event");
	take_message(BUSY, 1);

	atomic_store(&watching, 0);
	pthread_join(watcher, NULL);
	zdtm_check(atomic_load(&idle_ready) == 0, "the idle channel polled ready %ld times of %ld",
		   atomic_load(&idle_ready), atomic_load(&idle_polls));
	zdtm_check(atomic_load(&idle_polls) > 0, "the idle channel was never polled");
	/* non-blocking, as UCX makes its channels: still, and with no event */
	struct ibv_cq *none;
	void *context;

	zdtm_check(fcntl(rx[IDLE].channel->fd, F_GETFL) & O_NONBLOCK,
		   "the idle channel's fd lost O_NONBLOCK");
	zdtm_check(ibv_get_cq_event(rx[IDLE].channel, &none, &context) && errno == EAGAIN,
		   "get_cq_event on the idle channel did not fail with EAGAIN: %m");
	send_to(IDLE, 0);
	zdtm_check(readable(rx[IDLE].channel->fd, 5000), "no event on the idle channel");
	zdtm_check(epoll_ready(ep, 5000) == 1 << IDLE, "epoll misses the idle channel's event");
	take_message(IDLE, 0);
	zdtm_pass("%ld steps, 3 events, each once", steps);
	return 0;
}
