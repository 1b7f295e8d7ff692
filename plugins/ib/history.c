/*
 * A QP's state transitions as the application made them (virtual ids),
 * replayed on the new real QP at a rebuild.  A transition to RESET starts
 * over; a full history keeps the way up to RTS (INIT, RTR, RTS) and drops
 * the oldest change after it (later ones change a few attributes only).
 */
#include <string.h>
#include "ib.h"

void ib_history_record(struct ib_qp *qp, const struct ibv_qp_attr *attr, int mask)
{
	if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RESET) {
		qp->nhistory = 0;	/* a new QP is in RESET: nothing to replay */
		qp->ibv.state = IBV_QPS_RESET;
		return;
	}
	if (qp->nhistory == IB_MAX_HISTORY) {
		memmove(&qp->history[IB_HISTORY_KEEP], &qp->history[IB_HISTORY_KEEP + 1],
			(IB_MAX_HISTORY - IB_HISTORY_KEEP - 1) * sizeof(qp->history[0]));
		qp->nhistory--;
	}
	qp->history[qp->nhistory].attr = *attr;
	qp->history[qp->nhistory].mask = mask;
	qp->nhistory++;
	if (mask & IBV_QP_STATE)
		qp->ibv.state = attr->qp_state;
}

/* The last value the application set for a field, from the history. */
const struct ibv_qp_attr *ib_history_last(const struct ib_qp *qp, int field)
{
	for (unsigned i = qp->nhistory; i-- > 0;)
		if (qp->history[i].mask & field)
			return &qp->history[i].attr;
	return NULL;
}

