/*
 * ckpt coordinator protocol: the one place where checkpoint and restart
 * phases are named.  Both the shim (C) and the coordinator (Python, via
 * cffi reading the block between the cffi markers) use this file.
 *
 * Transport: a Unix stream socket (path in $CKPT_COORD), one text line
 * per message, fields separated by single spaces, '\n' terminated.
 * See docs/PROTOCOL.md for the message grammar.
 */
#ifndef CKPT_PROTOCOL_H
#define CKPT_PROTOCOL_H

/* cffi:begin */
enum ckpt_phase {
	/* checkpoint, in this order */
	CKPT_PHASE_SUSPEND = 0,	/* park every user thread */
	CKPT_PHASE_DRAIN = 1,	/* plugins empty in-flight data */
	CKPT_PHASE_WRITE = 2,	/* write and fsync the image */
	CKPT_PHASE_RESUME = 3,	/* refill drained data, unpark threads */
	/* restart, in this order (RESUME ends it too) */
	CKPT_PHASE_REBUILD = 4,	/* recreate real resources, PUT new ids */
	CKPT_PHASE_REFILL = 5,	/* GET peers' ids, refill drained data */
	/* forked write: after RESUME, wait for the copy-on-write child */
	CKPT_PHASE_SYNC = 6,
	/* the job is about to be killed (ckpt kill, checkpoint --kill):
	 * TCP connections are reset, so no TIME_WAIT keeps their ports
	 * from a restart on this host */
	CKPT_PHASE_TERMINATE = 7,
	/* before SUSPEND, with the application running: plugins whose
	 * hardware cannot be imaged stop issuing work and complete what is
	 * outstanding (STOP), then collect what is in flight towards them and
	 * release the hardware (RELEASE), job-wide barriers in between */
	CKPT_PHASE_STOP = 8,
	CKPT_PHASE_RELEASE = 9,
	/* after DRAIN: TCP connections inside the job are flushed to their
	 * receivers, each end sending a marker its peer reads up to (arg:
	 * the marker, 32 hex digits); RESUME gives the bytes back */
	CKPT_PHASE_FLUSH = 10,
	CKPT_PHASE_COUNT = 11
};

#define CKPT_PROTOCOL_VERSION 1
#define CKPT_LINE_MAX 4096
/* cffi:end */

static inline const char *ckpt_phase_name(enum ckpt_phase p)
{
	static const char *const names[CKPT_PHASE_COUNT] = {
		"SUSPEND", "DRAIN", "WRITE", "RESUME", "REBUILD", "REFILL", "SYNC", "TERMINATE",
		"STOP", "RELEASE", "FLUSH",
	};
	return (unsigned)p < CKPT_PHASE_COUNT ? names[p] : "?";
}

#endif
