/*
 * Shared set-up of the verbs test programs: one device, one PD, a CQ and a
 * QP per process, and the out-of-band exchange of (LID, QPN, address,
 * rkey) through a MAP_SHARED table the parent creates before forking.
 */
#ifndef VERBS_COMMON_H
#define VERBS_COMMON_H

#include <infiniband/verbs.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include "../apps/zdtm.h"

struct peer_info {
	_Atomic int ready;
	uint16_t lid;
	uint32_t qpn;
	uint64_t addr;
	uint32_t rkey;
	uint64_t result;
	int done;
};

static inline struct peer_info *peer_table(int n)
{
	void *p = mmap(NULL, n * sizeof(struct peer_info), PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	zdtm_check(p != MAP_FAILED, "mmap peer table");
	return p;
}

static inline struct ibv_context *open_first_device(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx;

	zdtm_check(list && list[0], "no verbs device");
	ctx = ibv_open_device(list[0]);
	zdtm_check(ctx != NULL, "open %s", ibv_get_device_name(list[0]));
	ibv_free_device_list(list);
	return ctx;
}

static inline uint16_t port_lid(struct ibv_context *ctx)
{
	struct ibv_port_attr attr;

	zdtm_check(ibv_query_port(ctx, 1, &attr) == 0, "query port");
	return attr.lid;
}

static inline void wait_all_ready(struct peer_info *t, int n)
{
	for (int i = 0; i < n; i++)
		while (!atomic_load(&t[i].ready))
			sched_yield();
}

static inline int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	int got;

	while ((got = ibv_poll_cq(cq, 1, wc)) == 0)
		sched_yield();
	zdtm_check(got == 1, "poll_cq: %d", got);
	return got;
}

#endif
