/*
 * The plugin's part in a checkpoint.  The checkpoint thread runs the hooks
 * but cannot call the verbs library (it has no fd table of the
 * application's and must not take the library's locks), so the work is
 * done by the plugin's agent, an ordinary thread of the application:
 *
 *   STOP     close the gate (no new verbs calls), poll the CQs into their
 *            pending queues until every signaled send has completed;
 *   RELEASE  (after every process has stopped) collect the completions
 *            still arriving, then destroy every real object and close the
 *            devices: the image then holds no device state at all;
 *   RESUME   the agent rebuilds everything (rebuild.c) once the threads
 *            run again, and opens the gate; on a restart the same.
 *
 * A checkpoint that fails after STOP opens the gate again (RESUME abort).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "ckpt_plugin.h"
#include "ib.h"

#define STOP_TIMEOUT_NS (10 * 1000000000LL)
#define QUIET_NS (20 * 1000000LL)	/* no completion for this long: nothing in flight */
#define HOOK_TIMEOUT_MS 20000
#define EXIT_REBUILD_FAILED 70	/* EX_SOFTWARE */

enum ib_state { IB_RUNNING, IB_STOPPED, IB_RELEASED };
enum agent_request { REQ_NONE, REQ_STOP, REQ_RELEASE, REQ_REBUILD, REQ_OPEN };

static _Atomic int state = IB_RUNNING;
static _Atomic int request = REQ_NONE;
static _Atomic int done_seq;		/* bumped when a request is finished */
static _Atomic int result;
static _Atomic int busy;		/* the agent is working on a request */
static char why[200];			/* reason for a failed request */
static unsigned resume_epoch;
static unsigned stop_seq;
static long members;			/* verbs processes in the last checkpoint */
static pthread_once_t agent_once = PTHREAD_ONCE_INIT;
static int agent_started;

static void (*hook_fail)(const char *fmt, ...);
/* the shim's hold on the application's interrupted fd waits (poll,
 * epoll_wait...) while the channel and async fds are being replaced */
static void (*waits_hold)(void), (*waits_release)(void);
static void (*warn)(const char *fmt, ...);

void ib_log(const char *fmt, ...)
{
	char msg[300];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (warn)
		warn("ib: %s", msg);
	else
		fprintf(stderr, "ckpt: ib: %s\n", msg);
}

/* CKPT_IB_DEBUG=1: what the rebuild did, on stderr. */
void ib_debug(const char *fmt, ...)
{
	static int on = -1;
	char msg[400];
	va_list ap;

	if (on < 0)
		on = getenv("CKPT_IB_DEBUG") != NULL;
	if (!on)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "ckpt-ib[%d]: %s\n", getpid(), msg);
}

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void futex_wait(_Atomic int *word, int value, int64_t timeout_ns)
{
	struct timespec ts = { timeout_ns / 1000000000LL, timeout_ns % 1000000000LL };

	syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, value, timeout_ns ? &ts : NULL, NULL, 0);
}

static void futex_wake(_Atomic int *word)
{
	syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

int ib_cq_push_pending(struct ib_cq *cq, const struct ibv_wc *wc)
{
	if ((cq->pending_tail + 1) % (cq->pending_cap ? cq->pending_cap : 1) == cq->pending_head) {
		unsigned cap = cq->pending_cap ? cq->pending_cap * 2 : 64, n = 0;
		struct ibv_wc *ring = malloc(cap * sizeof(*ring));

		if (!ring)
			return ENOMEM;
		while (cq->pending_head != cq->pending_tail) {
			ring[n++] = cq->pending[cq->pending_head];
			cq->pending_head = (cq->pending_head + 1) % cq->pending_cap;
		}
		free(cq->pending);
		cq->pending = ring;
		cq->pending_cap = cap;
		cq->pending_head = 0;
		cq->pending_tail = n;
	}
	cq->pending[cq->pending_tail] = *wc;
	cq->pending_tail = (cq->pending_tail + 1) % cq->pending_cap;
	return 0;
}

/* Every completion the devices have now, into the pending queues. */
static int collect(int *err)
{
	struct ibv_wc wc[32];
	int total = 0;

	for (struct ib_ctx *ctx = ib_contexts; ctx; ctx = ctx->next)
		for (struct ib_cq *cq = ctx->cqs; cq; cq = cq->next) {
			int got;

			while ((got = ib_poll_real(cq, 32, wc)) > 0) {
				for (int i = 0; i < got && !*err; i++)
					*err = ib_cq_push_pending(cq, &wc[i]);
				total += got;
			}
		}
	return total;
}

static int sends_outstanding(void)
{
	for (struct ib_ctx *ctx = ib_contexts; ctx; ctx = ctx->next)
		for (struct ib_qp *qp = ctx->qps; qp; qp = qp->next)
			if (atomic_load(&qp->sends_pending) > 0)
				return 1;
	return 0;
}

static int do_stop(void)
{
	int64_t deadline = now_ns() + STOP_TIMEOUT_NS;
	struct timespec nap = { 0, 100000 };
	int err = 0;

	pthread_mutex_lock(&ib_control_lock);	/* held until the gate opens again */
	ib_gate_close();
	/* count ourselves in: the rebuild waits for this many processes */
	err = ib_kv_count_in(stop_seq, "members", NULL);
	if (err) {
		snprintf(why, sizeof(why), "cannot reach the coordinator: %s", strerror(err));
		ib_gate_open();
		return err;
	}
	for (;;) {
		collect(&err);
		if (err || !sends_outstanding())
			break;
		if (now_ns() > deadline) {
			snprintf(why, sizeof(why), "sends did not complete within %lld s",
				 STOP_TIMEOUT_NS / 1000000000LL);
			err = ETIMEDOUT;
			break;
		}
		nanosleep(&nap, NULL);
	}
	if (err) {
		ib_gate_open();
		pthread_mutex_unlock(&ib_control_lock);
		return err;
	}
	atomic_store(&state, IB_STOPPED);
	return 0;
}

/*
 * A thread blocked in the real ibv_get_cq_event (or get_async_event)
 * reads the real fd: the checkpoint's signal makes it read that number
 * again, maybe after a restart.  Until it has, the number must give
 * end-of-file, not a file opened meanwhile: /dev/null holds it (if nobody
 * took it first: F_DUPFD gives the lowest free number from it).
 */
static int hold_released(int fd)
{
	int null, held;

	if (fd < 0)
		return -1;
	null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null < 0 || null == fd)	/* the lowest free number: often fd itself */
		return null;
	held = fcntl(null, F_DUPFD_CLOEXEC, fd);
	close(null);
	if (held != fd) {
		if (held >= 0)
			close(held);
		return -1;
	}
	return held;
}

void ib_waited_init(struct ib_waited_fd *w)
{
	memset(w, 0, sizeof(*w));
	w->held = -1;
}

/* Called with ib_objects_lock held, as the release and the rebuild are. */
static void release_waited(struct ib_waited_fd *w, int real_fd)
{
	/* a thread of an older release never came back: its number stays held */
	if (w->held >= 0 && w->stale)
		ib_debug("fd %d stays held: %d thread(s) never read it again", w->held, w->stale);
	else if (w->held >= 0)
		close(w->held);
	w->held = hold_released(real_fd);
	w->stale = w->inside;
	w->rebuilt = 0;
}

static void drop_if_unread(struct ib_waited_fd *w)
{
	if (w->rebuilt && !w->stale && w->held >= 0) {
		close(w->held);
		w->held = -1;
	}
}

void ib_waited_rebuilt(struct ib_waited_fd *w)
{
	w->rebuilt = 1;
	drop_if_unread(w);
}

/* Sets the release generation the thread enters in.  Fails if a
 * checkpoint closed the gate since the thread passed it: the real object
 * may be gone already, and the thread must wait at the gate again. */
int ib_wait_enter(struct ib_waited_fd *w, unsigned *gen)
{
	int closed;

	pthread_mutex_lock(&ib_objects_lock);
	closed = atomic_load(&ib_gate_closed);
	if (!closed) {
		w->inside++;
		*gen = atomic_load(&ib_releases);
	}
	pthread_mutex_unlock(&ib_objects_lock);
	return closed ? -1 : 0;
}

void ib_wait_leave(struct ib_waited_fd *w, unsigned gen)
{
	pthread_mutex_lock(&ib_objects_lock);
	w->inside--;
	if (gen != atomic_load(&ib_releases) && w->stale)
		w->stale--;
	drop_if_unread(w);
	pthread_mutex_unlock(&ib_objects_lock);
}

static void release_ctx(struct ib_ctx *ctx)
{
	for (struct ib_channel *ch = ctx->channels; ch; ch = ch->next)
		ib_channel_hold_fd(ctx, ch);	/* first: it reads the real CQs' events */
	for (struct ib_ah *ah = ctx->ahs; ah; ah = ah->next)
		if (ib_real.destroy_ah(ah->real))
			ib_log("releasing an address handle: %s", strerror(errno));
	for (struct ib_qp *qp = ctx->qps; qp; qp = qp->next)
		if (ib_real.destroy_qp(qp->real))
			ib_log("releasing QP %u: %s", qp->ibv.qp_num, strerror(errno));
	for (struct ib_srq *srq = ctx->srqs; srq; srq = srq->next)
		ib_real.destroy_srq(srq->real);
	for (struct ib_cq *cq = ctx->cqs; cq; cq = cq->next)
		ib_real.destroy_cq(cq->real);	/* its events were acked as read */
	for (struct ib_channel *ch = ctx->channels; ch; ch = ch->next) {
		int real_fd = ch->real->fd;

		ib_real.destroy_comp_channel(ch->real);
		release_waited(&ch->waited, real_fd);
	}
	for (struct ib_mr *mr = ctx->mrs; mr; mr = mr->next)
		ib_real.dereg_mr(mr->real);
	for (struct ib_pd *pd = ctx->pds; pd; pd = pd->next)
		ib_real.dealloc_pd(pd->real);
	{
		int async_fd = ctx->real->async_fd;

		ib_epoll_watchers_save(ctx->ibv.async_fd, &ctx->async_watchers);
		ib_real.close_device(ctx->real);
		release_waited(&ctx->waited, async_fd);
	}
	ctx->real = NULL;
	ib_fd_hold(ctx->ibv.async_fd, 0);
	ib_fd_hold(ctx->ibv.cmd_fd, 0);
}

static int do_release(void)
{
	int64_t quiet_since = now_ns();
	struct timespec nap = { 0, 200000 };
	int err = 0;

	while (now_ns() - quiet_since < QUIET_NS && !err) {
		if (collect(&err))
			quiet_since = now_ns();
		nanosleep(&nap, NULL);
	}
	if (err) {
		snprintf(why, sizeof(why), "cannot keep the collected completions: %s",
			 strerror(err));
		return err;
	}
	err = ib_kv_members(stop_seq, &members);
	if (err) {
		snprintf(why, sizeof(why), "cannot reach the coordinator: %s", strerror(err));
		return err;
	}
	pthread_mutex_lock(&ib_objects_lock);
	for (struct ib_ctx *ctx = ib_contexts; ctx; ctx = ctx->next)
		release_ctx(ctx);
	ib_idmap_clear(&ib_ids.qp_by_real);
	atomic_fetch_add(&ib_releases, 1);
	pthread_mutex_unlock(&ib_objects_lock);
	ib_kv_reset();		/* not part of the image: the coordinator may change */
	atomic_store(&state, IB_RELEASED);
	return 0;
}

/*
 * Without its verbs objects the application cannot go on (its next verbs
 * call would find no real object), and waiting would hang it: it ends,
 * saying why, with the status a failed restart has.
 */
static void rebuild_failed(int err)
{
	fprintf(stderr, "ckpt: ib: process %d cannot go on: rebuilding its verbs objects "
		"failed: %s\n", getpid(), strerror(err));
	_exit(EXIT_REBUILD_FAILED);
}

static void *agent_main(void *arg)
{
	(void)arg;
	for (;;) {
		int req, err = 0;

		atomic_store(&busy, 1);
		req = atomic_exchange(&request, REQ_NONE);
		if (req == REQ_NONE) {
			atomic_store(&busy, 0);
			futex_wait(&request, REQ_NONE, 0);
			continue;
		}
		why[0] = '\0';
		if (req == REQ_STOP || req == REQ_RELEASE) {
			int64_t t0 = now_ns();

			err = req == REQ_STOP ? do_stop() : do_release();
			if (!err)	/* the plugin's share of the stopped time */
				ib_debug("%s in %.3f ms", req == REQ_STOP ? "stopped" : "released",
					 (now_ns() - t0) / 1e6);
		} else if (req == REQ_REBUILD) {
			int64_t t0 = now_ns();
			unsigned long k0 = ib_kv_requests();

			ib_ids.epoch = resume_epoch;
			err = ib_rebuild(members);
			ib_debug("rebuilt in %.3f ms with %lu name-service requests",
				 (now_ns() - t0) / 1e6, ib_kv_requests() - k0);
			if (err)
				rebuild_failed(err);
			atomic_store(&state, IB_RUNNING);
			ib_gate_open();
			if (waits_hold && waits_release)
				waits_release();
			pthread_mutex_unlock(&ib_control_lock);
		} else if (req == REQ_OPEN) {	/* the checkpoint failed after STOP */
			atomic_store(&state, IB_RUNNING);
			ib_gate_open();
			pthread_mutex_unlock(&ib_control_lock);
		}
		atomic_store(&result, err);
		atomic_store(&busy, 0);
		atomic_fetch_add(&done_seq, 1);
		futex_wake(&done_seq);
	}
	return NULL;
}

static void start_agent(void)
{
	pthread_t tid;
	sigset_t all, old;

	/* the agent takes no signal of the application's */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	agent_started = pthread_create(&tid, NULL, agent_main, NULL) == 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (agent_started)
		pthread_setname_np(tid, "ckpt-ib");
}

void ib_agent_start(void)
{
	pthread_once(&agent_once, start_agent);
}

/* The rebuild of the last checkpoint runs on after its RESUME: a next
 * checkpoint waits for it before it asks for anything. */
static int wait_agent_idle(void)
{
	int64_t deadline = now_ns() + HOOK_TIMEOUT_MS * 1000000LL;
	struct timespec nap = { 0, 1000000 };

	while (atomic_load(&state) == IB_RELEASED || atomic_load(&busy) ||
	       atomic_load(&request) != REQ_NONE) {
		if (now_ns() > deadline) {
			snprintf(why, sizeof(why), "the verbs objects of the last checkpoint are "
				 "still being rebuilt");
			return EBUSY;
		}
		nanosleep(&nap, NULL);
	}
	return 0;
}

/* From the checkpoint thread: hand req to the agent and wait for it. */
static int ask_agent(int req, int wait)
{
	int seq = atomic_load(&done_seq);
	int64_t deadline = now_ns() + HOOK_TIMEOUT_MS * 1000000LL;

	atomic_store(&request, req);
	futex_wake(&request);
	if (!wait)
		return 0;
	while (atomic_load(&done_seq) == seq) {
		int64_t left = deadline - now_ns();

		if (left <= 0) {
			snprintf(why, sizeof(why), "the verbs agent did not answer");
			return ETIMEDOUT;
		}
		futex_wait(&done_seq, seq, left);
	}
	return atomic_load(&result);
}

static int hook(const struct ckpt_hook_ctx *ctx, void *arg)
{
	int err = 0;

	(void)arg;
	if (!agent_started)
		return 0;	/* never opened a device */
	switch (ctx->phase) {
	case CKPT_PHASE_STOP:
		stop_seq = ctx->seq;
		err = wait_agent_idle();
		if (!err)
			err = ask_agent(REQ_STOP, 1);
		break;
	case CKPT_PHASE_RELEASE:
		if (atomic_load(&state) == IB_STOPPED)
			err = ask_agent(REQ_RELEASE, 1);
		break;
	case CKPT_PHASE_RESUME:
		/* the agent runs once the threads do: nothing waits for it here */
		if (atomic_load(&state) == IB_RELEASED) {
			resume_epoch = ctx->seq;
			if (waits_hold && waits_release)
				waits_hold();
			ask_agent(REQ_REBUILD, 0);
		} else if (atomic_load(&state) == IB_STOPPED) {
			ask_agent(REQ_OPEN, 0);
		}
		break;
	default:
		break;
	}
	if (err && hook_fail)
		hook_fail("%s", why[0] ? why : strerror(err));
	return err;
}

/*
 * A forked child has no agent and no devices of its own: the parent's
 * objects are the parent's (a child cannot use them, as with a real HCA),
 * so it forgets them, or its first checkpoint would rebuild them and
 * publish the parent's virtual ids as its own.  The copies stay in its
 * memory, unreachable.  A fork during a checkpoint would leave the
 * child's gate closed: it opens it (it has nothing to checkpoint yet).
 */
static void forget_after_fork(void)
{
	ib_ids.owner[0] = '\0';
	agent_started = 0;
	agent_once = (pthread_once_t)PTHREAD_ONCE_INIT;
	ib_control_lock = (pthread_mutex_t)PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
	ib_objects_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
	ib_contexts = NULL;
	ib_ids.qp_by_real = (struct ib_idmap)IB_IDMAP_INIT;
	ib_ids.lkeys = (struct ib_idmap)IB_IDMAP_INIT;
	atomic_store(&state, IB_RUNNING);
	atomic_store(&ib_gate_users, 0);
	atomic_store(&ib_gate_closed, 0);
	ib_kv_forget();
}

__attribute__((constructor)) static void ib_plugin_init(void)
{
	static const struct ckpt_plugin plugin = { .name = "ib", .hook = hook };
	int (*reg)(const struct ckpt_plugin *) =
		(int (*)(const struct ckpt_plugin *))dlsym(RTLD_DEFAULT, "ckpt_plugin_register");

	hook_fail = (void (*)(const char *, ...))dlsym(RTLD_DEFAULT, "ckpt_hook_fail");
	warn = (void (*)(const char *, ...))dlsym(RTLD_DEFAULT, "ckpt_warn");
	waits_hold = (void (*)(void))dlsym(RTLD_DEFAULT, "ckpt_resume_waits_hold");
	waits_release = (void (*)(void))dlsym(RTLD_DEFAULT, "ckpt_resume_waits_release");
	ib_kv_init();
	if (reg)
		reg(&plugin);
	pthread_atfork(NULL, NULL, forget_after_fork);
}
