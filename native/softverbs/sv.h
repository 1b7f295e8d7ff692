/*
 * softverbs: a user-space InfiniBand verbs device, built as a drop-in
 * libibverbs.so.1.  Internal definitions shared by the source files.
 *
 * Object model: every public ibv_* object is embedded as the first member
 * of an sv_* object so the two convert with a cast (container_of style, as
 * rdma-core providers do).  All mutable data-path state of one opened
 * device (QPs, CQs, SRQs, MR table) is protected by the context lock; the
 * application threads and the context's progress thread both take it.
 */
#ifndef SV_H
#define SV_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <netinet/in.h>

#define SV_MAX_DEVICES		8
#define SV_MAX_SGE		16
#define SV_MAX_INLINE		256
#define SV_MAX_QP_WR		16384
#define SV_MAX_CQE		(1 << 20)
#define SV_MAX_QP		(1 << 16)
#define SV_MAX_MR		(1 << 16)
#define SV_MAX_RD_ATOMIC	16
#define SV_PKT_PAYLOAD		(64 * 1024)	/* RC segment, AF_UNIX */
#define SV_UDP_PAYLOAD		(32 * 1024)	/* RC segment, UDP */
#define SV_GRH_LEN		40
#define SV_UD_MTU		4096		/* IBV_MTU_4096 */
#define SV_MAX_MSG		(1u << 30)
#define SV_UD_STALL_NS		(2000ull * 1000 * 1000)	/* give up backpressure */
#define SV_APP_ACTIVE_NS	(1000ull * 1000)	/* app polled recently */
#define SV_ACK_DELAY_NS		(20ull * 1000)	/* wait for a reply to carry it */
#define SV_ACK_COALESCE		8
#define SV_RX_BATCH		8	/* packets per recvmmsg */
#define SV_UDP_POLL_EVERY	8	/* progress passes per UDP check */

#define SV_SUBNET_PREFIX	0xfe80000000000000ull

/* ---- configuration and devices (device.c) ---- */

struct sv_config {
	char dir[256];			/* per-user runtime dir (shared state) */
	char names[SV_MAX_DEVICES][IBV_SYSFS_NAME_MAX];
	int ndev;
	bool have_seed;
	uint64_t seed;
	uint32_t ipv4;			/* host address, network order */
	char host[32];			/* dotted ipv4: names state files */
	uint64_t fabric;		/* hash of dir: separates fabrics */
};

/* Where a QP's packets go: a local AF_UNIX name or a remote UDP port. */
struct sv_addr {
	union {
		struct sockaddr sa;
		struct sockaddr_un un;
		struct sockaddr_in in;
	};
	socklen_t len;
	bool udp;
};

/*
 * The head of every device is laid out like rdma-core's struct
 * verbs_device (driver.h, IBVERBS_PRIVATE_34): providers loaded next to
 * softverbs (libmlx5 via UCX) tell their own devices by comparing ->ops
 * with their ops table (mlx5dv_is_supported()), so ops must be there and
 * point at softverbs' own table (provider.c).
 */
struct sv_list_node {
	struct sv_list_node *next, *prev;
};

struct sv_device {
	struct ibv_device ibdev;	/* must be first */
	const void *ops;		/* verbs_device.ops: &sv_provider_ops */
	atomic_int refcount;		/* verbs_device.refcount (unused) */
	struct sv_list_node entry;	/* verbs_device.entry (unused) */
	void *sysfs;			/* verbs_device.sysfs: NULL, no kernel */
	uint64_t core_support;		/* verbs_device.core_support */
	/* softverbs' own */
	int index;
	uint64_t node_guid;		/* host order */
};

extern struct sv_config sv_cfg;
void sv_config_load(void);
uint64_t sv_mix64(uint64_t x);
uint64_t sv_now_ns(void);
void sv_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Per-incarnation identity of a device, shared by all processes on a host
 * through <dir>/<name>.state (see device.c). */
struct sv_incarnation {
	uint64_t number;
	uint64_t key;			/* seeds QPN drawing */
	uint16_t lid;
};

int sv_incarnation_join(struct sv_device *dev, struct sv_incarnation *inc);
void sv_incarnation_leave(struct sv_device *dev);
uint32_t sv_draw_qpn(struct sv_device *dev, const struct sv_incarnation *inc);

/* ---- provider interface (provider.c) ---- */

extern const struct sv_provider_ops sv_provider_ops;
bool sv_is_device(const struct ibv_device *device);

/* ---- objects ---- */

struct sv_context;
struct sv_route;

struct sv_pd {
	struct ibv_pd ibpd;
};

struct sv_mr {
	struct ibv_mr ibmr;
	int access;
	uint64_t iova;
};

struct sv_channel {
	struct ibv_comp_channel ibch;
	struct sv_cq **events;		/* queue of CQs with a pending event */
	int nevents, cap;
};

struct sv_cq {
	struct ibv_cq ibcq;
	struct ibv_wc *ring;
	int size;			/* capacity of ring */
	int head, count;
	int armed;			/* 0, 1 = any, 2 = solicited only */
	bool overflowed;
	uint32_t events_reported;	/* async events read (ctx->lock) */
	uint32_t comp_events_reported;	/* completion events read (ctx->lock) */
};

struct sv_rwqe {
	uint64_t wr_id;
	int num_sge;
	struct ibv_sge sge[SV_MAX_SGE];
};

struct sv_rq {
	struct sv_rwqe *wqe;
	uint32_t cap, head, count;
	uint32_t max_sge;
};

struct sv_srq {
	struct ibv_srq ibsrq;
	struct sv_rq rq;
	uint32_t limit;			/* 0 = not armed */
	uint32_t events_reported;	/* async events read (ctx->lock) */
};

struct sv_ah {
	struct ibv_ah ibah;
	struct ibv_ah_attr attr;
};

struct sv_swqe {
	uint64_t wr_id;
	enum ibv_wr_opcode opcode;
	unsigned int send_flags;
	uint32_t imm;			/* network order, as posted */
	int num_sge;
	struct ibv_sge sge[SV_MAX_SGE];
	uint32_t len;
	uint8_t inl[SV_MAX_INLINE];	/* copy of inline data */
	uint64_t raddr;
	uint32_t rkey;
	/* UD addressing */
	struct ibv_ah_attr av;
	uint32_t rqpn, rqkey;
	/* RC progress */
	uint32_t psn;
	uint32_t tx_off;		/* bytes transmitted so far */
	uint32_t rx_off;		/* read: bytes of response received */
	uint64_t first_tx_ns;		/* UD: when transmission was first tried */
	int fail;			/* local error status to report */
};

/* A READ the responder has yet to answer (fully): like an HCA's responder
 * resources, it waits while the requester's queue is full. */
struct sv_rd_resp {
	uint32_t psn, rkey, len, off;
	uint64_t raddr;
};

struct sv_qp {
	struct ibv_qp ibqp;
	struct sv_qp *next;		/* context's QP list */
	uint32_t events_reported;	/* async events read (ctx->lock) */
	int fd;				/* datagram socket named by LID+QPN */
	int ufd;			/* UDP socket for other hosts */
	struct ibv_qp_attr attr;	/* current attributes */
	struct ibv_qp_cap cap;
	int sq_sig_all;
	/* send queue: free-running counters, slot = counter % sq_cap;
	 * [head, tx) await their ack, [tx, tail) await transmission */
	struct sv_swqe *sq;
	uint32_t sq_cap, sq_head, sq_tx, sq_tail;
	uint32_t next_psn;		/* PSN of next new request */
	uint64_t ack_deadline_ns;	/* oldest unacked request times out */
	uint64_t retx_at_ns;		/* RNR backoff: retransmit no earlier */
	int retry_left, rnr_left;
	/* UD: a destination that stopped draining; further messages to it
	 * are dropped at once for a while instead of stalling again */
	uint16_t stalled_lid;
	uint32_t stalled_qpn;
	uint64_t stalled_until_ns;
	struct sv_rq rq;
	/* RC responder */
	uint32_t epsn;			/* expected PSN */
	bool rx_drop;			/* after RNR NAK: drop until resend */
	bool rx_active;			/* a multi-packet message is underway */
	struct sv_rwqe rx_wqe;		/* receive WQE being filled */
	bool rx_have_wqe;
	struct sv_mr *rx_mr;		/* RDMA write target */
	bool ack_pending;		/* ack_psn not yet sent */
	uint32_t ack_psn;
	uint32_t ack_count;		/* messages covered by it */
	uint64_t ack_due_ns;
	struct sv_addr peer;		/* RC/UC: the remote QP */
	struct sv_rd_resp rd[SV_MAX_RD_ATOMIC];	/* oldest first */
	uint32_t rd_head, rd_count;
};

struct sv_async {
	struct ibv_async_event ev;
};

struct sv_context {
	struct verbs_context vctx;	/* ibv_context lives at its end */
	struct sv_device *dev;
	struct sv_incarnation inc;
	pthread_mutex_t lock;
	struct sv_qp *qps;
	int nqps;
	struct sv_mr **mrs;		/* index = lkey >> 8 */
	uint32_t nmrs;
	struct sv_route *routes;	/* cache of resolved remote QPs */
	uint8_t *rxbuf;			/* SV_RX_BATCH packet buffers */
	size_t rxbuf_len;
	/* progress thread */
	pthread_t thread;
	bool thread_started;
	bool in_thread;			/* progress runs on the thread */
	unsigned int passes;		/* progress passes, paces UDP polls */
	int epfd;			/* all QP sockets + wake eventfd */
	int wakefd;
	atomic_bool stop;
	_Atomic uint64_t app_active_ns;
	/* counters, printed at close with SOFTVERBS_DEBUG=1 */
	struct {
		uint64_t timeouts, rnr_naks, dup_reqs, ooo_drops, state_drops;
		/* work requests posted and their bytes, per QP type: show
		 * which transport carried a job's traffic */
		uint64_t rc_wrs, rc_bytes, uc_wrs, uc_bytes, ud_wrs, ud_bytes;
	} stats;
	/* async events */
	struct sv_async *aq;
	int naq, aqcap;
};

static inline struct sv_context *to_sctx(struct ibv_context *ibctx)
{
	return (struct sv_context *)((char *)ibctx -
				     offsetof(struct sv_context, vctx.context));
}
#define to_sqp(q)	((struct sv_qp *)(q))
#define to_scq(c)	((struct sv_cq *)(c))
#define to_ssrq(s)	((struct sv_srq *)(s))
#define to_smr(m)	((struct sv_mr *)(m))
#define to_sah(a)	((struct sv_ah *)(a))
#define to_sch(c)	((struct sv_channel *)(c))

/* ---- verbs.c helpers used by the transport ---- */
int sv_req_notify_cq(struct ibv_cq *cq, int solicited_only);
void sv_cq_push(struct sv_context *ctx, struct sv_cq *cq,
		const struct ibv_wc *wc, bool solicited);
void sv_async_push(struct sv_context *ctx, enum ibv_event_type type,
		   void *obj);
void sv_qp_to_error(struct sv_context *ctx, struct sv_qp *qp);
struct sv_mr *sv_mr_lookup(struct sv_context *ctx, uint32_t key);

/* ---- transport.c ---- */
void sv_resolve(struct sv_context *ctx, uint16_t lid, uint32_t qpn,
		struct sv_addr *a);
int sv_qp_bind(struct sv_context *ctx, struct sv_qp *qp);
void sv_qp_unbind(struct sv_context *ctx, struct sv_qp *qp);
void sv_progress(struct sv_context *ctx);
void sv_qp_flush(struct sv_context *ctx, struct sv_qp *qp);
void sv_qp_ack_flush(struct sv_context *ctx, struct sv_qp *qp);
int sv_progress_start(struct sv_context *ctx);
void sv_progress_stop(struct sv_context *ctx);
void sv_progress_wake(struct sv_context *ctx);
int sv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
		 struct ibv_send_wr **bad_wr);
int sv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
		 struct ibv_recv_wr **bad_wr);
int sv_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr,
		     struct ibv_recv_wr **bad_wr);
int sv_poll_cq(struct ibv_cq *cq, int ne, struct ibv_wc *wc);
int sv_rq_post(struct sv_rq *rq, struct ibv_recv_wr *wr,
	       struct ibv_recv_wr **bad_wr);

#define SV_EXPORT __attribute__((visibility("default")))

#endif
