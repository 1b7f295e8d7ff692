/*
 * The InfiniBand plugin: the application is handed virtual verbs objects
 * (each embeds the struct the application reads, followed by the plugin's
 * record of it) whose context's ops point into the plugin.  The plugin
 * forwards to the real objects of whatever libibverbs is loaded, and
 * translates ids both ways, so QP numbers, LIDs and keys the application
 * holds stay valid when the real ones change.
 *
 * At every checkpoint the plugin lets go of the hardware (STOP: no new
 * posts, outstanding sends complete; RELEASE: in-flight completions are
 * collected, every real object is destroyed) and rebuilds it when the job
 * resumes, on this host or on the new one after a restart: one path for
 * both, run at every checkpoint.  docs/IB.md has the whole story.
 */
#ifndef CKPT_IB_H
#define CKPT_IB_H

#include <infiniband/verbs.h>
#include <stdatomic.h>
#include <stdint.h>
#include "idmap.h"
#include "kv.h"

#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#define IB_EXPORT __attribute__((visibility("default")))
#define IB_MAX_PORTS 4
#define IB_MAX_SGE 16
#define IB_MAX_HISTORY 8
#define IB_HISTORY_KEEP 3	/* INIT, RTR, RTS */

struct ib_ctx;

struct ib_pd {
	struct ibv_pd ibv;
	struct ibv_pd *real;
	struct ib_pd *next;
};

struct ib_mr {
	struct ibv_mr ibv;		/* virtual lkey/rkey */
	struct ibv_mr *real;
	struct ib_pd *pd;
	int access;
	struct ib_mr *next;
};

/*
 * A real fd that threads block on inside the real library (the channel's
 * for ibv_get_cq_event, the context's async fd).  A release closes it under
 * such a thread, whose read is restarted on the same number after the
 * checkpoint, maybe only after a restart: until every thread that was
 * inside has come back out, the number stays on /dev/null (end-of-file),
 * never given to a file opened meanwhile, whose bytes the thread would
 * take for an event of a channel that no longer exists.
 */
struct ib_waited_fd {
	int held;		/* the released number, on /dev/null; -1: none */
	int inside;		/* threads inside the real call now */
	int stale;		/* of those, threads that entered before the release */
	int rebuilt;		/* the release's rebuild is done */
};

/* The epoll sets watching an fd of ours when it was released
 * (epoll_watchers.c). */
#define IB_EPOLL_WATCHERS_MAX 4

struct ib_epoll_watcher {
	int epfd;
	uint32_t events;
	uint64_t data;
};

struct ib_epoll_watchers {
	unsigned n;
	struct ib_epoll_watcher e[IB_EPOLL_WATCHERS_MAX];
};

void ib_epoll_watchers_save(int fd, struct ib_epoll_watchers *w);
void ib_epoll_watchers_restore(int fd, const struct ib_epoll_watchers *w);

/* What the application's number for a channel's fd names (app_fds.c). */
enum ib_fd_state {
	IB_FD_BOUND,	/* the real channel (a dup of its fd) */
	IB_FD_HELD,	/* a placeholder: the device is released */
	IB_FD_OWED,	/* a ready placeholder: rebuilt, owing an event */
};

struct ib_channel {
	struct ibv_comp_channel ibv;	/* fd: ours, a dup of the real one */
	struct ibv_comp_channel *real;
	struct ib_waited_fd waited;	/* the real fd, ibv_get_cq_event's */
	enum ib_fd_state fd_state;
	struct ib_epoll_watchers watchers;	/* of fd, as it is moved */
	struct ib_channel *next;
};

struct ib_cq {
	struct ibv_cq ibv;
	struct ibv_cq *real;
	struct ib_channel *channel;
	int comp_vector;
	int armed, solicited_only;
	int event_owed;			/* raised, unread, lost with a released channel */
	/* completion events handed to the application and acked by it
	 * (ibv.mutex); the real ones are acked as they are read */
	uint32_t events_handed, events_acked;
	uint32_t async_handed;		/* async events handed out (ibv.mutex) */
	/* completions collected at a checkpoint, returned before new ones */
	struct ibv_wc *pending;
	unsigned pending_head, pending_tail, pending_cap;
	struct ib_cq *next;
};

/* A receive work request posted and not completed yet. */
struct ib_recv {
	uint64_t wr_id;
	int num_sge;
	struct ibv_sge sge[IB_MAX_SGE];
};

/* A queue of posted receives: FIFO for a QP's receive queue; for an SRQ
 * completions come in any order, so entries are found by wr_id. */
struct ib_recv_log {
	struct ib_recv *ring;
	unsigned head, tail, cap;	/* head == tail: empty; cap slots */
};

struct ib_srq {
	struct ibv_srq ibv;
	struct ibv_srq *real;
	struct ib_pd *pd;
	struct ibv_srq_init_attr attr;
	struct ib_recv_log posted;
	pthread_mutex_t post_lock;
	uint32_t async_handed;		/* async events handed out (ibv.mutex) */
	struct ib_srq *next;
};

struct ib_modify {
	struct ibv_qp_attr attr;	/* virtual ids */
	int mask;
};

struct ib_qp {
	struct ibv_qp ibv;		/* qp_num: virtual */
	struct ibv_qp *real;
	struct ib_pd *pd;
	struct ibv_qp_init_attr init;	/* virtual CQs and SRQ */
	struct ib_modify history[IB_MAX_HISTORY];	/* state transitions */
	unsigned nhistory;
	struct ib_recv_log posted;
	_Atomic long sends_pending;	/* signaled sends not completed */
	uint32_t async_handed;		/* async events handed out (ibv.mutex) */
	/* the connected peer (RC/UC), resolved at each rebuild */
	char peer_owner[80];
	struct ib_idmap rkeys;		/* peer's virtual rkey -> real */
	struct ib_qp *next;
};

struct ib_ah {
	struct ibv_ah ibv;
	struct ibv_ah *real;
	struct ib_pd *pd;
	struct ibv_ah_attr attr;	/* virtual dlid */
	struct ib_ah *next;
};

struct ib_ctx {
	struct ibv_context ibv;		/* async_fd: ours, a dup of the real one */
	struct ibv_context *real;
	struct ib_waited_fd waited;	/* the real async fd, ibv_get_async_event's */
	struct ib_epoll_watchers async_watchers;	/* of async_fd, while released */
	char dev_name[IBV_SYSFS_NAME_MAX];
	uint8_t nports;
	uint16_t vlid[IB_MAX_PORTS + 1];	/* port -> the LID the app knows */
	uint16_t lid[IB_MAX_PORTS + 1];		/* port -> real LID now */
	union ibv_gid vgid[IB_MAX_PORTS + 1];	/* port -> GID 0 the app knows */
	union ibv_gid gid[IB_MAX_PORTS + 1];	/* port -> real GID 0 now */
	struct ib_pd *pds;
	struct ib_mr *mrs;
	struct ib_channel *channels;
	struct ib_cq *cqs;
	struct ib_srq *srqs;
	struct ib_qp *qps;
	struct ib_ah *ahs;
	struct ib_ctx *next;
};

/* The real library's functions (real.c). */
struct ib_real {
	struct ibv_device **(*get_device_list)(int *);
	void (*free_device_list)(struct ibv_device **);
	struct ibv_context *(*open_device)(struct ibv_device *);
	int (*close_device)(struct ibv_context *);
	const char *(*get_device_name)(struct ibv_device *);
	int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
	int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
	int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
	int (*query_pkey)(struct ibv_context *, uint8_t, int, __be16 *);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *);
	int (*dealloc_pd)(struct ibv_pd *);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
	struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *, void *, size_t, uint64_t, unsigned int);
	int (*rereg_mr)(struct ibv_mr *, int, struct ibv_pd *, void *, size_t, int);
	int (*dereg_mr)(struct ibv_mr *);
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *);
	int (*destroy_comp_channel)(struct ibv_comp_channel *);
	struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *,
				    struct ibv_comp_channel *, int);
	int (*destroy_cq)(struct ibv_cq *);
	int (*resize_cq)(struct ibv_cq *, int);
	int (*get_cq_event)(struct ibv_comp_channel *, struct ibv_cq **, void **);
	void (*ack_cq_events)(struct ibv_cq *, unsigned int);
	struct ibv_srq *(*create_srq)(struct ibv_pd *, struct ibv_srq_init_attr *);
	int (*modify_srq)(struct ibv_srq *, struct ibv_srq_attr *, int);
	int (*query_srq)(struct ibv_srq *, struct ibv_srq_attr *);
	int (*destroy_srq)(struct ibv_srq *);
	struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
	int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
	int (*query_qp)(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *);
	int (*destroy_qp)(struct ibv_qp *);
	struct ibv_ah *(*create_ah)(struct ibv_pd *, struct ibv_ah_attr *);
	int (*destroy_ah)(struct ibv_ah *);
	int (*init_ah_from_wc)(struct ibv_context *, uint8_t, struct ibv_wc *,
			       struct ibv_grh *, struct ibv_ah_attr *);
	int (*get_async_event)(struct ibv_context *, struct ibv_async_event *);
	void (*ack_async_event)(struct ibv_async_event *);
};

extern struct ib_real ib_real;
int ib_real_load(void);

/* The gate (gate.c): every verbs call passes it; it closes from STOP to
 * the end of the rebuild, and callers wait there. */
extern _Atomic int ib_gate_closed;
extern _Atomic unsigned ib_releases;	/* how many times the devices were released */
extern _Atomic long ib_gate_users;
void ib_gate_wait(void);
static inline void ib_enter(void)
{
	for (;;) {
		atomic_fetch_add(&ib_gate_users, 1);
		if (__builtin_expect(!atomic_load(&ib_gate_closed), 1))
			return;
		atomic_fetch_sub(&ib_gate_users, 1);
		ib_gate_wait();
	}
}
static inline void ib_leave(void)
{
	atomic_fetch_sub_explicit(&ib_gate_users, 1, memory_order_release);
}
void ib_gate_close(void);		/* and wait for callers inside to leave */

/*
 * Control-path calls (create, modify, destroy) run whole under one
 * recursive lock, which the agent holds from STOP until the rebuild is
 * done: no such call straddles a checkpoint, half on the old objects and
 * half on the new.  (Recursive: the real library calls some exported
 * functions itself.)  The data path does not take it.
 */
extern pthread_mutex_t ib_control_lock;
static inline int ib_control_begin(void)
{
	pthread_mutex_lock(&ib_control_lock);
	return 0;
}
static inline void ib_control_end(int *unused)
{
	(void)unused;
	pthread_mutex_unlock(&ib_control_lock);
}
#define IB_CONTROL_CALL \
	int ib_control_ __attribute__((cleanup(ib_control_end), unused)) = ib_control_begin()
void ib_gate_open(void);

/* Translation (ids.c).  remap is 0 until the first rebuild of the job:
 * until then every virtual id is the real one. */
struct ib_ids {
	_Atomic int remap;
	_Atomic int lkeys_moved;	/* an MR's lkey was not its real one (collision) */
	unsigned epoch;			/* the checkpoint of the last rebuild */
	char owner[80];			/* host-pid: whose rkeys */
	struct ib_idmap qp_by_real;	/* local real qpn -> struct ib_qp * */
	struct ib_idmap lkeys;		/* local virtual lkey -> real */
	struct ib_idmap remote_qpn;	/* remote (vlid<<24|vqpn) or vqpn -> real */
	struct ib_idmap remote_lid;	/* remote vlid -> real */
	struct ib_idmap back;		/* remote (real lid<<24|qpn) -> virtual */
	pthread_mutex_t gid_lock;	/* the GID caches: few entries, slow path */
	unsigned ngids;
	union ibv_gid gid_virtual[64], gid_real[64];
};
extern struct ib_ids ib_ids;

uint32_t ib_real_qpn(uint32_t vqpn);
uint16_t ib_real_lid(uint16_t vlid);
void ib_real_gid(union ibv_gid *gid);
void ib_virtual_gid(union ibv_gid *gid);
void ib_real_ah_attr(struct ibv_ah_attr *attr);
void ib_virtual_grh(struct ib_qp *qp, const struct ibv_wc *wc);
void ib_virtual_source(uint16_t *slid, uint32_t *src_qp);
uint32_t ib_real_rkey(struct ib_qp *qp, uint32_t vrkey);
uint32_t ib_real_lkey(uint32_t vlkey);
int ib_publish_qp(struct ib_ctx *ctx, struct ib_qp *qp, struct ib_kv_batch *b);
int ib_publish_mr(struct ib_mr *mr, struct ib_kv_batch *b);
int ib_publish_gids(struct ib_ctx *ctx, struct ib_kv_batch *b);
uint32_t ib_claim_qpn(uint32_t real_qpn);
void ib_ids_epoch_from_job(void);

/* Objects (verbs.c). */
extern pthread_mutex_t ib_objects_lock;
extern struct ib_ctx *ib_contexts;
void ib_ctx_init_ops(struct ib_ctx *ctx);
struct ib_qp *ib_qp_of_real(uint32_t real_qpn);
int ib_cq_push_pending(struct ib_cq *cq, const struct ibv_wc *wc);
void ib_qp_real_init(const struct ib_qp *qp, struct ibv_qp_init_attr *real);
void ib_qp_resolve_peer(struct ib_qp *qp, uint32_t dest_vqpn);
void ib_real_qp_attr(struct ibv_qp_attr *attr, int mask);
void ib_agent_start(void);

/* QP transitions (history.c). */
void ib_history_record(struct ib_qp *qp, const struct ibv_qp_attr *attr, int mask);
const struct ibv_qp_attr *ib_history_last(const struct ib_qp *qp, int field);

/* Receive logs (recvlog.c). */
int ib_recv_log_init(struct ib_recv_log *log, unsigned cap);
int ib_recv_log_push(struct ib_recv_log *log, const struct ibv_recv_wr *wr);
void ib_recv_log_pop_front(struct ib_recv_log *log);
void ib_recv_log_remove(struct ib_recv_log *log, uint64_t wr_id);
unsigned ib_recv_log_count(const struct ib_recv_log *log);
const struct ib_recv *ib_recv_log_at(const struct ib_recv_log *log, unsigned i);

/* The data path (datapath.c). */
int ib_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int ib_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
int ib_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
int ib_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
int ib_req_notify_cq(struct ibv_cq *cq, int solicited_only);
int ib_poll_real(struct ib_cq *cq, int n, struct ibv_wc *wc);
int ib_repost_recv(struct ibv_qp *real, const struct ib_recv *r);
int ib_repost_srq_recv(struct ibv_srq *real, const struct ib_recv *r);

/* Checkpoint and rebuild (lifecycle.c, rebuild.c). */
int ib_stop(void);
int ib_release(void);
int ib_rebuild(long members);
void ib_waited_init(struct ib_waited_fd *w);
/* The application's fd numbers across a release (app_fds.c). */
void ib_fd_hold(int fd, int ready);
int ib_fd_bind(int app_fd, int real_fd);
void ib_channel_hold_fd(struct ib_ctx *ctx, struct ib_channel *ch);
void ib_channel_bind_fd(struct ib_ctx *ctx, struct ib_channel *ch);
void ib_channel_settle_fd(struct ib_ctx *ctx, struct ib_channel *ch);
int ib_wait_enter(struct ib_waited_fd *w, unsigned *gen);
void ib_wait_leave(struct ib_waited_fd *w, unsigned gen);
void ib_waited_rebuilt(struct ib_waited_fd *w);
void ib_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ib_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
