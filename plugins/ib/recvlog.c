/* Receive work requests posted and not yet completed: re-posted, in their
 * order, on the rebuilt queue pair or SRQ. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "ib.h"

int ib_recv_log_init(struct ib_recv_log *log, unsigned cap)
{
	log->cap = cap + 1;
	log->head = log->tail = 0;
	log->ring = calloc(log->cap, sizeof(*log->ring));
	return log->ring ? 0 : ENOMEM;
}

unsigned ib_recv_log_count(const struct ib_recv_log *log)
{
	if (!log->cap)		/* a QP on an SRQ: its receives are the SRQ's */
		return 0;
	return (log->tail + log->cap - log->head) % log->cap;
}

const struct ib_recv *ib_recv_log_at(const struct ib_recv_log *log, unsigned i)
{
	return &log->ring[(log->head + i) % log->cap];
}

int ib_recv_log_push(struct ib_recv_log *log, const struct ibv_recv_wr *wr)
{
	struct ib_recv *r;

	if (wr->num_sge > IB_MAX_SGE || wr->num_sge < 0 || !log->cap)
		return EINVAL;
	if ((log->tail + 1) % log->cap == log->head)
		return ENOMEM;		/* more than the queue holds: the device says so too */
	r = &log->ring[log->tail];
	r->wr_id = wr->wr_id;
	r->num_sge = wr->num_sge;
	memcpy(r->sge, wr->sg_list, wr->num_sge * sizeof(struct ibv_sge));
	log->tail = (log->tail + 1) % log->cap;
	return 0;
}

void ib_recv_log_pop_front(struct ib_recv_log *log)
{
	if (log->cap && log->head != log->tail)
		log->head = (log->head + 1) % log->cap;
}

/* An SRQ's completion: the oldest entry with that wr_id goes; the ones
 * before it move up one slot. */
void ib_recv_log_remove(struct ib_recv_log *log, uint64_t wr_id)
{
	unsigned n = ib_recv_log_count(log);

	for (unsigned i = 0; i < n; i++) {
		unsigned at = (log->head + i) % log->cap;

		if (log->ring[at].wr_id != wr_id)
			continue;
		for (unsigned j = i; j > 0; j--)
			log->ring[(log->head + j) % log->cap] =
				log->ring[(log->head + j - 1) % log->cap];
		log->head = (log->head + 1) % log->cap;
		return;
	}
}
