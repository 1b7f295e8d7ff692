/*
 * Kernel AIO requests still in flight.  The kernel shows no request that
 * has not completed (its ring holds only completions), so requests are
 * noted here as the program submits them through syscall() (as libaio
 * does) and forgotten as their completions are reaped (io_getevents,
 * io_pgetevents), they are cancelled or their context is destroyed.  An
 * iocb submitted again replaces its earlier note: a program reuses an
 * iocb only once it completed.
 *
 * The image keeps the requests not reaped (CKPT_REC_AIO_REQUESTS: context
 * and iocb address); the restart submits again those whose completion the
 * restored ring does not hold (restart/aio.c), from the iocbs in the
 * restored memory.  A request in flight across a plain checkpoint needs
 * nothing: the kernel keeps it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/aio_abi.h>
#include <stdio.h>
#include <sys/syscall.h>
#include "shim.h"

#define MAX_REQUESTS 4096

static struct ckpt_aio_request requests[MAX_REQUESTS];
static unsigned nrequests;
static int overflowed;		/* a request could not be noted */
static char requests_lock;	/* app threads only; the checkpoint thread reads
				 * while they are parked */

static void lock(void)
{
	while (__atomic_test_and_set(&requests_lock, __ATOMIC_ACQUIRE))
		;
}

static void unlock(void)
{
	__atomic_clear(&requests_lock, __ATOMIC_RELEASE);
}

/* Called locked; the last entry takes the place of the one dropped. */
static void forget_at(unsigned i)
{
	requests[i] = requests[--nrequests];
}

static void forget(uint64_t ctx, uint64_t iocb)
{
	for (unsigned i = 0; i < nrequests; i++)
		if (requests[i].ctx == ctx && requests[i].iocb == iocb) {
			forget_at(i);
			return;
		}
}

static void note(uint64_t ctx, uint64_t iocb)
{
	forget(ctx, iocb);
	if (nrequests == MAX_REQUESTS)
		overflowed = 1;
	else
		requests[nrequests++] = (struct ckpt_aio_request){ .ctx = ctx, .iocb = iocb };
}

static void forget_context(uint64_t ctx)
{
	for (unsigned i = nrequests; i-- > 0;)
		if (requests[i].ctx == ctx)
			forget_at(i);
}

static int is_aio_call(long nr)
{
	return nr == SYS_io_submit || nr == SYS_io_getevents || nr == SYS_io_pgetevents ||
	       nr == SYS_io_cancel || nr == SYS_io_destroy;
}

/* Called locked, or with every application thread parked. */
static void note_call(long nr, const long *args, long result)
{
	uint64_t ctx = (uint64_t)args[0];

	if (nr == SYS_io_submit) {
		struct iocb **cbs = (struct iocb **)args[2];

		for (long i = 0; i < result; i++)
			note(ctx, (uint64_t)(uintptr_t)cbs[i]);
	} else if (nr == SYS_io_getevents || nr == SYS_io_pgetevents) {
		const struct io_event *events = (const struct io_event *)args[3];

		for (long i = 0; i < result; i++)
			forget(ctx, events[i].obj);
	} else if (nr == SYS_io_cancel) {
		forget(ctx, (uint64_t)args[1]);
	} else {
		forget_context(ctx);
	}
}

/* After the program's own syscall(nr, args...) returned result. */
void aio_note_call(long nr, const long *args, long result)
{
	if (result < 0 || !is_aio_call(nr))
		return;
	lock();
	note_call(nr, args, result);
	unlock();
}

/* A thread parked right after an AIO call returned, before its wrapper
 * noted it: the note is made here (again by the wrapper later, which
 * changes nothing), or the image would list a request already reaped (the
 * restart would submit it again) or miss one just submitted.  Not locked:
 * the lock's holder may be parked. */
static void note_parked_threads_calls(void)
{
	for (unsigned i = 0; i < quiesce_count(); i++) {
		const struct parked_thread *t = quiesce_thread(i);

		if (t && t->returned_call[7] >= 0 && is_aio_call(t->returned_call[0]))
			note_call(t->returned_call[0], t->returned_call + 1, t->returned_call[7]);
	}
}

/* At SUSPEND: whether every request in flight could be noted. */
int aio_requests_unsupported(char *why, size_t why_size)
{
	if (!overflowed)
		return 0;
	snprintf(why, why_size, "more than %d kernel AIO requests were in flight at once: "
		 "those not noted could not be submitted again at a restart", MAX_REQUESTS);
	return ENOTSUP;
}

/* The requests not reaped, as one record when there are any. */
int aio_requests_write(struct image_writer *w)
{
	note_parked_threads_calls();
	if (!nrequests)
		return 0;
	return iw_record(w, CKPT_REC_AIO_REQUESTS, requests,
			 nrequests * sizeof(struct ckpt_aio_request));
}
