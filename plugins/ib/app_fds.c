/*
 * The application's numbers for a device's fds (a completion channel's,
 * the async fd, the command fd) across a release.  The application keeps
 * its numbers; while the device is released each is held by a placeholder
 * that is ready exactly when the real file would be, and the rebuild binds
 * it to the new real file again.
 *
 * Readiness matters because event loops poll these numbers (Open MPI's
 * progress thread polls its UD connection manager's channel) and run
 * between RELEASE and SUSPEND: a number that polled ready with no event
 * behind it sent a thread into ibv_get_cq_event for good.  And the events
 * the device raised that nobody had read go with the released channel:
 * they are owed, handed out again by ibv_get_cq_event (verbs.c), and until
 * they are the channel's number stays on a ready placeholder, since the
 * new real channel would not be ready for them.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include "ib.h"

/* Puts a placeholder under fd: an eventfd with nothing to read (an idle
 * channel) or with a count nobody reads (a channel with an event unread),
 * with the file status flags the application had set (UCX makes its async
 * fd non-blocking), which the rebuilt file then gets from it. */
void ib_fd_hold(int fd, int ready)
{
	int placeholder, flags;

	if (fd < 0)
		return;
	flags = fcntl(fd, F_GETFL);
	placeholder = eventfd(ready ? 1 : 0, EFD_CLOEXEC);
	if (placeholder < 0 || (placeholder != fd && dup3(placeholder, fd, O_CLOEXEC) < 0))
		ib_log("fd %d: no placeholder (%m): it names the released file", fd);
	if (placeholder >= 0 && placeholder != fd)
		close(placeholder);
	if (flags >= 0)
		fcntl(fd, F_SETFL, flags);
}

/* The application's number now names the new real file, with the status
 * flags the application gave the number (maybe while it was held). */
int ib_fd_bind(int app_fd, int real_fd)
{
	int flags;

	if (app_fd < 0 || real_fd < 0)
		return 0;
	flags = fcntl(app_fd, F_GETFL);
	if (dup3(real_fd, app_fd, O_CLOEXEC) < 0) {
		ib_log("fd %d cannot name the rebuilt file: %m", app_fd);
		return -1;
	}
	if (flags >= 0)
		fcntl(app_fd, F_SETFL, flags);
	return 0;
}

static int owes_event(const struct ib_ctx *ctx, const struct ib_channel *ch)
{
	for (const struct ib_cq *cq = ctx->cqs; cq; cq = cq->next)
		if (cq->channel == ch && cq->event_owed)
			return 1;
	return 0;
}

static int polls_ready(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

/* The application's number names a new file: the epoll sets watching the
 * old one watch it instead (the kernel drops an entry with its file). */
static int move_fd(int app_fd, int to_fd, struct ib_epoll_watchers *w)
{
	ib_epoll_watchers_save(app_fd, w);
	if (ib_fd_bind(app_fd, to_fd))
		return -1;
	ib_epoll_watchers_restore(app_fd, w);
	return 0;
}

/*
 * The events the channel holds unread, and the event an armed CQ raises
 * (or, on a slower device, is about to) for the completions the
 * checkpoint collected from it, are owed to the application: the real
 * channel and CQs go.  Such a CQ is disarmed, as the device leaves a CQ
 * that raised its event.
 */
static void take_unread(struct ib_ctx *ctx, struct ib_channel *ch)
{
	int fd = ch->real->fd, flags = fcntl(fd, F_GETFL);
	struct ibv_cq *real;
	void *context;

	if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK)) {
		ib_log("channel fd %d: %m: its unread events are lost", fd);
	} else {
		while (!ib_real.get_cq_event(ch->real, &real, &context)) {
			struct ib_cq *cq = context;

			cq->event_owed = 1;
			cq->armed = 0;
			ib_real.ack_cq_events(real, 1);
		}
		fcntl(fd, F_SETFL, flags);	/* a thread may block in it again */
	}
	for (struct ib_cq *cq = ctx->cqs; cq; cq = cq->next)
		if (cq->channel == ch && cq->armed && cq->pending_head != cq->pending_tail) {
			cq->event_owed = 1;
			cq->armed = 0;
		}
}

/*
 * At the release, while the real CQs exist: the application's number goes
 * to a placeholder, ready if the channel is now, so an event loop polling
 * it sees no change; then the channel's events are taken, owed.
 */
void ib_channel_hold_fd(struct ib_ctx *ctx, struct ib_channel *ch)
{
	int ready = polls_ready(ch->real->fd) || owes_event(ctx, ch);

	ib_epoll_watchers_save(ch->ibv.fd, &ch->watchers);
	ib_fd_hold(ch->ibv.fd, ready);
	ib_epoll_watchers_restore(ch->ibv.fd, &ch->watchers);
	ch->fd_state = IB_FD_HELD;
	take_unread(ctx, ch);
	if (!ready && owes_event(ctx, ch))	/* raised since, or to be raised */
		eventfd_write(ch->ibv.fd, 1);
}

/* The new real channel exists: its number names it, unless the channel
 * owes an event (then ib_channel_settle_fd does, once they are taken). */
void ib_channel_bind_fd(struct ib_ctx *ctx, struct ib_channel *ch)
{
	ch->fd_state = IB_FD_OWED;
	ib_channel_settle_fd(ctx, ch);
}

/* With ib_objects_lock held (or the device released): a rebuilt channel
 * whose owed events were all taken (or whose CQs went) names the real
 * channel again. */
void ib_channel_settle_fd(struct ib_ctx *ctx, struct ib_channel *ch)
{
	if (ch->fd_state != IB_FD_OWED || owes_event(ctx, ch))
		return;
	if (!move_fd(ch->ibv.fd, ch->real->fd, &ch->watchers))
		ch->fd_state = IB_FD_BOUND;
}
