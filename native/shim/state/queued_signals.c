/*
 * The siginfo of pending signals: a signal pending at a checkpoint comes
 * back with what its handler reads (sigqueue()'s value, the sender's pid,
 * a child's exit status), not as a bare kill().
 *
 * The kernel lets nobody read a pending signal's siginfo without taking
 * it, so each queue is taken (rt_sigtimedwait) and put straight back in
 * the same order while the job is parked: the job sees no change.  Only
 * a thread can take from its own queue, so each does in the parking
 * handler; the process's queue is taken by the checkpoint thread once all
 * are parked, and put back by the main thread, the one thread the kernel
 * lets queue a signal to the process with a kill()'s or the kernel's
 * siginfo.  Left in place, restored from the pending bitmasks alone: a
 * POSIX timer's signal and SIGALRM (taking one re-arms its timer early).
 *
 * Restored by restore_queue (native/restart/state/process.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "shim.h"

_Static_assert(sizeof(siginfo_t) == CKPT_SIGINFO_SIZE, "siginfo_t is 128 bytes");

/* A queue as its image record lays it out: a struct ckpt_signal_queue,
 * then the siginfos, in one scratch buffer. */
struct signal_queue {
	struct ckpt_signal_queue *rec;
	size_t size;			/* bytes mapped */
};

/* one per parked thread (by slot), and the process's last */
#define PROCESS_QUEUE CKPT_MAX_THREADS
static struct signal_queue queues[CKPT_MAX_THREADS + 1];

static siginfo_t *queue_entry(const struct signal_queue *q, uint32_t i)
{
	return (siginfo_t *)(q->rec + 1) + i;
}

/* Room for one more siginfo; scratch memory, which no image holds. */
static int make_room(struct signal_queue *q)
{
	size_t need = sizeof(*q->rec) + (q->rec ? q->rec->count + 1 : 1) * sizeof(siginfo_t);
	size_t size = q->size ? q->size : CKPT_PAGE_SIZE;
	struct ckpt_signal_queue *bigger;

	if (q->rec && need <= q->size)
		return 0;
	while (size < need)
		size *= 2;
	bigger = scratch_map(size);
	if (!bigger)
		return ENOMEM;
	if (q->rec) {
		memcpy(bigger, q->rec, q->size);
		scratch_unmap(q->rec, q->size);
	} else {
		memset(bigger, 0, sizeof(*bigger));
	}
	q->rec = bigger;
	q->size = size;
	return 0;
}

/* Never taken: SIGALRM (taking it re-arms its interval timer early) and
 * those no queue can hold; a POSIX timer's signal neither (the same). */
static const uint64_t never_taken = 1ULL << (SIGKILL - 1) | 1ULL << (SIGSTOP - 1) |
				    1ULL << (SIGALRM - 1) | 1ULL << (CKPT_SIGNAL - 1);

/* The POSIX timers' signals, from /proc/self/timers' "signal: N/..."
 * lines (a parked thread has no ckpt_process to look at). */
static uint64_t timer_signals(void)
{
	size_t size = CKPT_MAX_TIMERS * 128 + 1;
	char *buf = scratch_map(size), *line;
	uint64_t mask = 0;
	ssize_t n;

	if (!buf)
		return ~0ULL;	/* take nothing rather than guess */
	n = ckpt_read_file("/proc/self/timers", buf, size - 1);
	for (line = buf; n > 0 && (line = strstr(line, "signal: ")); line++) {
		int sig = atoi(line + 8);

		if (sig > 0 && sig < CKPT_NSIG)
			mask |= 1ULL << (sig - 1);
	}
	scratch_unmap(buf, size);
	return mask;
}

/* Signals pending for the calling thread alone (its SigPnd), read only
 * when rt_sigpending says some signal is. */
uint64_t queued_signals_own_pending(void)
{
	uint64_t any = 0;

	if (syscall(SYS_rt_sigpending, &any, sizeof(any)) || !any)
		return 0;
	return shim_status_mask("/proc/thread-self/status", "SigPnd:");
}

static int take_one(uint64_t set, siginfo_t *si)
{
	struct timespec now = { 0, 0 };

	return syscall(SYS_rt_sigtimedwait, &set, si, &now, sizeof(set)) > 0;
}

/* Queue a signal again: a thread's by the thread, the process's by the
 * main thread.  Anyone else queueing a kill()'s or the kernel's siginfo
 * gets EPERM: then the bare signal, as kill() sends it. */
static void put_back_one(pid_t tid, siginfo_t *si)
{
	pid_t pid = getpid();
	long r = tid ? syscall(SYS_rt_tgsigqueueinfo, pid, tid, si->si_signo, si) :
		       syscall(SYS_rt_sigqueueinfo, pid, si->si_signo, si);

	if (r && errno == EPERM)
		r = tid ? syscall(SYS_tgkill, pid, tid, si->si_signo) : kill(pid, si->si_signo);
	if (r)
		shim_log("a pending signal %d could not be queued again: %s", si->si_signo,
			 shim_strerror(errno));
}

/* oldest first, so that the queue is as it was */
static void put_back(const struct signal_queue *q)
{
	for (uint32_t i = 0; q->rec && i < q->rec->count; i++)
		put_back_one(q->rec->tid, queue_entry(q, i));
}

/* Take every signal of `want` from the queue that own() says still holds
 * it, a copy of each kept in q. */
static void take_queue(struct signal_queue *q, pid_t tid, uint64_t want,
		       uint64_t (*own)(void))
{
	siginfo_t si;

	if (make_room(q))
		return;
	q->rec->tid = tid;
	q->rec->count = 0;
	while (want && take_one(want, &si)) {
		if (make_room(q)) {
			/* never lost: back at once, behind the ones still queued */
			shim_log("no memory to save the siginfo of pending signals");
			put_back_one(tid, &si);
			return;
		}
		*queue_entry(q, q->rec->count++) = si;
		want &= own();
	}
}

/* In the parking handler of the thread in this slot: its own queue. */
void queued_signals_take_thread(unsigned slot, uint64_t pending)
{
	struct signal_queue *q = &queues[slot];
	uint64_t want = pending & ~never_taken;

	if (want)
		want &= ~timer_signals();
	if (!want)
		return;
	take_queue(q, syscall(SYS_gettid), want, queued_signals_own_pending);
	put_back(q);
}

static uint64_t all_signals(void)
{
	return ~0ULL;
}

static void put_back_in_app(void *arg)
{
	put_back(arg);
}

/* In the checkpoint thread, every thread parked: the process's queue,
 * its timers read already.  A signal pending for this thread too would be
 * taken from its own queue first: such a signal is left in place. */
void queued_signals_take_process(const struct ckpt_process *p)
{
	struct signal_queue *q = &queues[PROCESS_QUEUE];
	uint64_t want = p->shared_pending & ~never_taken & ~queued_signals_own_pending();
	int err;

	for (uint32_t i = 0; i < p->ntimers && i < CKPT_MAX_TIMERS; i++)
		if (p->timers[i].signo > 0 && p->timers[i].signo < CKPT_NSIG)
			want &= ~(1ULL << (p->timers[i].signo - 1));
	if (!want)
		return;
	take_queue(q, 0, want, all_signals);
	if (!q->rec || !q->rec->count)
		return;
	err = quiesce_run_in_app(put_back_in_app, q);
	if (err) {
		shim_log("the main thread could not queue the pending signals again: %s",
			 shim_strerror(err));
		put_back(q);
	}
}

/* One CKPT_REC_SIGNALS record per queue that held signals. */
int queued_signals_write(struct image_writer *w)
{
	int err = 0;

	for (unsigned i = 0; !err && i <= PROCESS_QUEUE; i++) {
		const struct signal_queue *q = &queues[i];

		if (q->rec && q->rec->count && (i == PROCESS_QUEUE || quiesce_thread(i)))
			err = iw_record(w, CKPT_REC_SIGNALS, q->rec,
					sizeof(*q->rec) + q->rec->count * sizeof(siginfo_t));
	}
	return err;
}

/* After the checkpoint (written, or abandoned). */
void queued_signals_release(void)
{
	for (unsigned i = 0; i <= PROCESS_QUEUE; i++)
		if (queues[i].rec) {
			scratch_unmap(queues[i].rec, queues[i].size);
			queues[i] = (struct signal_queue){ NULL, 0 };
		}
}

/* After a restart: the scratch buffers the image named are gone. */
void queued_signals_forget(void)
{
	memset(queues, 0, sizeof(queues));
}
